# Tensor cores: layout assignment around dots, ldmatrix staging plans, the
# PTX of mma matmuls and attention blocks, ptxas over a grid of configs.
include(GoogleTest)
add_executable(codegen_mma_tests ${CMAKE_CURRENT_LIST_DIR}/MmaTest.cpp)
target_link_libraries(codegen_mma_tests PRIVATE flextile GTest::gtest_main)
target_include_directories(codegen_mma_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR})
gtest_discover_tests(codegen_mma_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 900)
