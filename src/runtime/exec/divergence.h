// Divergence checks: a non-finite loss or parameter gradient stops training with a message naming
// the step, the stage and the op (unless --allow-nonfinite). Cheap on the normal path: the loss is
// a number the step reads anyway, and the gradients cost a few fused kernels and one read (train
// --single reads both in one); only a failure pays for locating the op. Include only from runtime
// .cpp files (LibTorch).
#pragma once
#include <torch/torch.h>

#include <cstdint>

#include "runtime/exec/stage_module.h"

namespace gp::runtime {

/// Where a check runs, for the message: the step and the stage (-1: `train --single`).
struct StepPlace {
  int64_t step = 0;
  int stage = -1;
};

/// Throws RuntimeFailure when `loss` is nan or inf, naming the stage's loss op(s) with a non-finite
/// value and the first non-finite value of the forward pass: a received input (another stage's op)
/// or the output of this stage's first op (topological order) that produced one. `inputs` are the
/// stage's external inputs and `outputs` what StageModule::forward returned.
void check_loss_finite(double loss, const StageModule& m, const TensorMap& inputs, const TensorMap& outputs,
                       StepPlace where);

/// Throws RuntimeFailure when a parameter gradient of `m` holds nan or inf, naming the op and
/// parameter and how many values are nan / inf. One fused test first (gradient_probe, one read from
/// the device); the per-parameter scan runs only when that test fails (a norm that overflows while
/// every value is finite is not an error).
void check_gradients_finite(const StageModule& m, StepPlace where);

/// A one-element tensor on the gradients' device, finite when every parameter gradient of `m` is
/// (nan and inf propagate into it): the sum of their L2 norms, a few fused kernels. Undefined when
/// no parameter has a gradient. A caller that reads it together with other values (one sync for
/// all) passes the value to the overload below.
torch::Tensor gradient_probe(const StageModule& m);

/// check_gradients_finite with gradient_probe's value already read: returns at once when finite.
void check_gradients_finite(const StageModule& m, StepPlace where, double probe);

/// Sets one value of the first parameter's gradient that exists to NaN (GP_FAULT kind=nan).
void poison_first_gradient(const StageModule& m);

}  // namespace gp::runtime
