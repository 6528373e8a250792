# cmake -DPTX=... -DCUBIN=... -DOUT=... -P EmbedCubin.cmake
# Writes OUT, a C++ fragment holding the PTX text (kCubinTestPtx) and the cubin ptxas made from it
# (kCubinTestImage, kCubinTestImageSize), for the GPU test of runtime::Module::fromCompiled.
file(READ "${PTX}" ptx_text)
file(READ "${CUBIN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
file(WRITE "${OUT}" "// Generated from ${PTX} by EmbedCubin.cmake.\n"
  "constexpr const char* kCubinTestPtx = R\"ptx(${ptx_text})ptx\";\n"
  "alignas(16) constexpr unsigned char kCubinTestImage[] = {${bytes}};\n"
  "constexpr size_t kCubinTestImageSize = ${size};\n")
