# The tensor maps of TMA copies (codegen/TensorMaps.h): recipes from the IR, their sharing, their
# text form in the compile cache, the kernel parameters they add, and the errors for copies the
# host could not describe.
include(GoogleTest)
add_executable(codegen_tensor_maps_tests ${CMAKE_CURRENT_LIST_DIR}/TensorMapsTest.cpp)
target_link_libraries(codegen_tensor_maps_tests PRIVATE flextile GTest::gtest_main)
gtest_discover_tests(codegen_tensor_maps_tests DISCOVERY_TIMEOUT 60)
