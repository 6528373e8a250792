# Random tile programs through the passes and the lowering: the deterministic side of the
# tile_program fuzzer (tests/fuzz/), sharing its generator and property.
add_executable(codegen_random_program_tests
  ${CMAKE_CURRENT_LIST_DIR}/RandomTileProgramsTest.cpp
  ${PROJECT_SOURCE_DIR}/tests/fuzz/TileProgramProperty.cpp)
target_link_libraries(codegen_random_program_tests PRIVATE flextile GTest::gtest_main)
target_include_directories(codegen_random_program_tests PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/tests/fuzz)
target_compile_definitions(codegen_random_program_tests PRIVATE FLEXTILE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(codegen_random_program_tests DISCOVERY_TIMEOUT 60)
