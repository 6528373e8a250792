# Software pipelining: the pass's marks, the cp.async schedule in the PTX,
# shared-memory planning of the rings, interpreter equivalence, ptxas grid.
include(GoogleTest)
add_executable(codegen_pipeline_tests ${CMAKE_CURRENT_LIST_DIR}/PipelineTest.cpp)
target_link_libraries(codegen_pipeline_tests PRIVATE flextile GTest::gtest_main)
target_include_directories(codegen_pipeline_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR})
gtest_discover_tests(codegen_pipeline_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 900)
