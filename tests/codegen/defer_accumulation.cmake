# The defer-accumulation pass: its rotation, the loops it leaves alone, interpreter equivalence.
include(GoogleTest)
add_executable(codegen_defer_accumulation_tests ${CMAKE_CURRENT_LIST_DIR}/DeferAccumulationTest.cpp)
target_link_libraries(codegen_defer_accumulation_tests PRIVATE flextile GTest::gtest_main)
target_include_directories(codegen_defer_accumulation_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR})
target_compile_definitions(codegen_defer_accumulation_tests PRIVATE FLEXTILE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(codegen_defer_accumulation_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
