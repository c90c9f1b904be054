// Writes golden files (docs/golden-format.md).
//
// The file is assembled under a temporary name and renamed into place by commit(), so a file at the
// final path is always complete; a run that fails leaves nothing behind.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/h5_file.h"
#include "model/param_table.h"
#include "oracle/global_batch.h"
#include "oracle/train_step.h"

namespace touchstone {

struct GoldenOptions {
  bool save_optimizer_state = false;  // also write /steps/<s>/optimizer/exp_avg{,_sq}/<name>
};

// The error of a low-precision result against the FP64 one, as the envelope records it
// (docs/precision.md): {relative L2, largest element error / max |ref|} (absolute when ref is all
// zeros), where the largest element error is max |low - ref|, or rms(low - ref) * sqrt(2 ln n) when
// that is larger: one run's largest error is one sample and can be small by luck.
std::array<double, 2> envelope_error(const std::vector<double>& low, const std::vector<double>& ref);

// d(objective)/d(token loss) of every position [B*T] of a global batch under the config's
// normalisation (0 where the target is -100).
std::vector<double> position_loss_weights(const Config& config, const GlobalBatch& batch);

// The loss's envelope error (docs/precision.md): sum_i w_i |low_i - ref_i| / |ref loss| over the token
// losses, their errors added without cancellation, or the loss's own error when larger. One scalar's
// low-precision error can be near zero by luck; this cannot.
double loss_envelope_error(const std::vector<double>& weights, const std::vector<double>& low_token_losses,
                           const std::vector<double>& token_losses, double low_loss, double loss);

// The gradient norm's envelope error: max(|low - ref|, ||low grads - ref grads||) / ref over all
// gradient elements. | ||a|| - ||b|| | <= ||a - b||, so a run whose gradients are as far off as the
// low-precision run's has a norm at most this far off; the norm's own error, one scalar, can be near
// zero by luck.
double grad_norm_envelope_error(const ParamTensors& low_grads, const ParamTensors& grads, double low_norm,
                                double norm);

class GoldenWriter {
 public:
  // Opens the temporary file and writes the root attributes, /batch for every step and /params/init.
  // `backend` is the root attribute naming the kernels that compute the file ("cpu", "cuda (<GPU>)").
  GoldenWriter(const std::string& path, const Config& config, const ParamTable& table,
               const std::vector<GlobalBatch>& batches, const ParamTensors& initial_params,
               const GoldenOptions& options, const std::string& backend);

  // /steps/<s>/...: the record of update s, its full gradients, the full parameters after it and,
  // when the options ask for them, the full AdamW moments after it (may be null otherwise).
  void write_step(const StepRecord& record, const ParamTensors& grads, const ParamTensors& params,
                  const AdamWState* moments);

  // /envelope/error/<path> and /envelope/tolerance/<path> for every dataset of step s (docs/precision.md):
  // error = [relative L2, max |low - ref| / max |ref|] of the low-precision run against the FP64 run,
  // tolerance = envelope.k * error + envelope.floor.
  void write_envelope_step(const StepRecord& low, const ParamTensors& low_grads,
                           const ParamTensors& low_params, const StepRecord& ref,
                           const ParamTensors& ref_grads, const ParamTensors& ref_params);
  // The root attribute `tolerance_model` for an envelope file (k, floor and the precision measured).
  void write_tolerance_model(const Config& measured);

  void commit();

 private:
  void write_envelope(const std::string& path, const std::vector<double>& low,
                      const std::vector<double>& ref);
  void write_envelope(const std::string& path, const std::array<double, 2>& error);
  void write_tensors(const std::string& group, const ParamTensors& tensors);

  h5::H5Writer writer_;
  const ParamTable& table_;
  Precision precision_;
  GoldenOptions options_;
  EnvelopeConfig envelope_;
  int64_t windows_, seq_;
  std::vector<std::vector<double>> position_weights_;  // [steps][B*T]: for the loss's envelope
};

}  // namespace touchstone
