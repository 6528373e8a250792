# The measured shared-memory plan of convert_layout (codegen/ConversionPlan.h).
include(GoogleTest)
add_executable(codegen_conversion_plan_tests ${CMAKE_CURRENT_LIST_DIR}/ConversionPlanTest.cpp)
target_link_libraries(codegen_conversion_plan_tests PRIVATE flextile GTest::gtest_main)
gtest_discover_tests(codegen_conversion_plan_tests DISCOVERY_TIMEOUT 60)
