// The FlexTile tile language: include this and `using namespace flextile::dsl`.
#pragma once

#include "dsl/Capture.h"
#include "dsl/Kernel.h"
#include "dsl/Ops.h"
#include "dsl/Tensor.h"
#include "dsl/Tile.h"
