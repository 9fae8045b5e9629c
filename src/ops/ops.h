// Every differentiable op of the library in one include.
#pragma once

#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/index.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/pointwise.h"
#include "ops/random.h"
#include "ops/reduce.h"
#include "ops/shape_ops.h"
#include "ops/softmax.h"
