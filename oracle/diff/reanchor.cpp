// Touchstone's own step evaluated at the candidate's recorded parameters, on one process.
#include "oracle/diff/reanchor.h"

#include <chrono>
#include <stdexcept>

#include "kernels/backend.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/comm/context.h"

namespace touchstone::diff {

Anchors::Anchors(const GoldenReader& golden, const ToleranceModel& tolerances, const TensorMap& candidate)
    : golden_(golden), tolerances_(tolerances), candidate_(candidate) {}

std::optional<ParamTensors> complete_tensors(const ParamTable& table, const TensorMap& candidate,
                                             const std::string& prefix) {
  ParamTensors tensors;
  for (int id = 0; id < table.size(); ++id) {
    const auto tensor = candidate.find(prefix + table[id].name);
    if (tensor == candidate.end() || tensor->second.numel() != table[id].numel()) return std::nullopt;
    tensors.tensors.push_back(tensor->second.values);
  }
  return tensors;
}

const ParamTensors* Anchors::params_after(int64_t step) {
  auto found = params_.find(step);
  if (found == params_.end()) {
    const std::string prefix = step == 0 ? "params/init/" : "steps/" + std::to_string(step) + "/params/";
    std::optional<ParamTensors> anchor = complete_tensors(golden_.table(), candidate_, prefix);
    if (!anchor && step == 0) {  // the candidate loaded the golden initial parameters
      anchor = load_parameters(golden_.table(), golden_.path(), "/params/init");
    }
    found = params_.emplace(step, std::move(anchor)).first;
  }
  return found->second ? &*found->second : nullptr;
}

StepRecord Anchors::evaluate(const ParamTensors& params, int64_t step, Precision precision,
                             bool grad_accumulation_fusion) const {
  Config config = golden_.config();  // one process: the golden file's tensors are full
  config.precision = precision;
  config.train.grad_accumulation_fusion = grad_accumulation_fusion;
  const auto backend = make_cpu_backend(BackendOptions{precision, grad_accumulation_fusion});
  // The candidate's parameters as this precision's optimizer stores them (FP32 master weights below
  // FP64), as a run's initial weights are (oracle/run.cpp).
  ParamTensors master = params;
  for (auto& t : master.tensors) backend->round(TensorRole::kState, t.data(), static_cast<int64_t>(t.size()));
  SingleProcessContext processes;
  Trainer trainer(config, master, *backend, processes.context());
  const AdamWState zeros = AdamWState::zeros_like(master);
  trainer.restore(step - 1, master, zeros.exp_avg, zeros.exp_avg_sq);
  return trainer.step(golden_.batch(step), true);
}

const AnchoredStep* Anchors::step(int64_t step) {
  auto found = steps_.find(step);
  if (found != steps_.end()) return found->second.get();
  std::unique_ptr<AnchoredStep> anchored;
  if (const ParamTensors* params = params_after(step - 1)) {
    const auto start = std::chrono::steady_clock::now();
    anchored = std::make_unique<AnchoredStep>();
    anchored->step = step;
    const std::string before = golden_.params_before(step);
    // With an envelope the low-precision step is needed all the same: evaluate both.
    if (!tolerances_.envelope() && golden_.reader().exists(before) &&
        load_parameters(golden_.table(), golden_.path(), before).tensors == params->tensors) {
      anchored->golden = true;
      return steps_.emplace(step, std::move(anchored)).first->second.get();
    }
    const std::optional<EnvelopeModel>& envelope = tolerances_.envelope();
    anchored->truth = evaluate(*params, step, envelope ? Precision::kFp64 : golden_.precision(),
                               golden_.config().train.grad_accumulation_fusion);
    if (envelope) {
      anchored->low = evaluate(*params, step, envelope->precision, envelope->grad_accumulation_fusion);
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return steps_.emplace(step, std::move(anchored)).first->second.get();
}

StepRecord Anchors::evaluate_at(int64_t step, Precision precision) {
  const ParamTensors* params = params_after(step - 1);
  if (params == nullptr)
    throw std::logic_error("evaluate_at: no parameters after step " + std::to_string(step - 1));
  return evaluate(*params, step, precision, golden_.config().train.grad_accumulation_fusion);
}

std::vector<double> Anchors::value(const StepRecord& record, const std::string& group, int param) {
  if (group == "loss") return {record.loss};
  if (group == "num_loss_tokens") return {static_cast<double>(record.num_loss_tokens)};
  if (group == "grad_norm") return {record.grad_norm};
  if (group == "token_losses") return record.token_losses;
  return record.grads[param];
}

}  // namespace touchstone::diff
