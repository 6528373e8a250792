# The target descriptions (codegen/Target.h): each architecture's features and limits, names,
# and the error for a target FlexTile has no description of.
include(GoogleTest)
add_executable(codegen_target_tests ${CMAKE_CURRENT_LIST_DIR}/TargetTest.cpp)
target_link_libraries(codegen_target_tests PRIVATE flextile GTest::gtest_main)
gtest_discover_tests(codegen_target_tests DISCOVERY_TIMEOUT 60)
