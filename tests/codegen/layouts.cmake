# Axis analysis, layout assignment and shared-memory planning.
include(GoogleTest)
add_executable(codegen_layout_tests
  ${CMAKE_CURRENT_LIST_DIR}/AxisInfoTest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/AssignLayoutsTest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/AssignLayoutsFuzzTest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/AssignLayoutsSemanticsTest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/SharedMemoryTest.cpp)
target_link_libraries(codegen_layout_tests PRIVATE flextile GTest::gtest_main)
# AssignLayoutsFuzzTest uses the tile_program fuzzer's generator (tests/fuzz/TileProgramGenerator.h).
target_include_directories(codegen_layout_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/tests/fuzz)
gtest_discover_tests(codegen_layout_tests DISCOVERY_TIMEOUT 60)
