// The FlexTile tile language: include this and `using namespace flextile::dsl`.
#pragma once

#include "dsl/Kernel.h"
#include "dsl/Ops.h"
#include "dsl/Tile.h"
