# Lowering to LLVM/PTX: kernels built with ir::Builder and hand-given
# layouts, compiled for sm_80 and sm_90a and assembled with ptxas.
add_executable(codegen_lowering_tests ${CMAKE_CURRENT_LIST_DIR}/LoweringTest.cpp)
target_link_libraries(codegen_lowering_tests PRIVATE flextile GTest::gtest_main)
include(GoogleTest)
gtest_discover_tests(codegen_lowering_tests DISCOVERY_TIMEOUT 60)
