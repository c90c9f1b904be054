// Golden-file layout: root attributes, /batch, /params/init and one group per step.
#include "oracle/golden_writer.h"

#include <algorithm>
#include <cmath>

namespace touchstone {

namespace {

constexpr int64_t kFormatVersion = 1;

// The four [S, B, T] batch datasets, rows in global sample order.
void write_batches(h5::H5Writer& writer, const std::vector<GlobalBatch>& batches) {
  const auto steps = static_cast<int64_t>(batches.size());
  const int64_t B = batches.front().windows, T = batches.front().seq;
  auto stack = [&](auto member) {
    std::vector<int32_t> all;
    for (const GlobalBatch& batch : batches)
      all.insert(all.end(), (batch.*member).begin(), (batch.*member).end());
    return all;
  };
  writer.write_i32("/batch/tokens", stack(&GlobalBatch::tokens).data(), {steps, B, T});
  writer.write_i32("/batch/targets", stack(&GlobalBatch::targets).data(), {steps, B, T});
  writer.write_i32("/batch/position_ids", stack(&GlobalBatch::position_ids).data(), {steps, B, T});
  writer.write_i32("/batch/document_ids", stack(&GlobalBatch::document_ids).data(), {steps, B, T});
}

}  // namespace

GoldenWriter::GoldenWriter(const std::string& path, const Config& config, const ParamTable& table,
                           const std::vector<GlobalBatch>& batches, const ParamTensors& initial_params,
                           const GoldenOptions& options, const std::string& backend)
    : writer_(path),
      table_(table),
      precision_(config.precision),
      options_(options),
      envelope_(config.envelope),
      windows_(batches.front().windows),
      seq_(batches.front().seq) {
  write_batches(writer_, batches);
  write_tensors("/params/init", initial_params);
  writer_.set_attribute("/", "format", std::string("touchstone-golden"));
  writer_.set_attribute("/", "format_version", kFormatVersion);
  writer_.set_attribute("/", "precision", config.precision);
  writer_.set_attribute("/", "loss_normalization", config.train.loss_normalization);
  writer_.set_attribute("/", "config", to_json(config).dump());
  // How a comparison decides pass or fail when nothing better is known (docs/golden-format.md).
  writer_.set_attribute("/", "tolerance_model",
                        config.precision == "fp64" ? std::string(R"({"kind": "fp64", "relative_l2": 1e-10})")
                                                   : std::string(R"({"kind": "unspecified"})"));
  writer_.set_attribute("/", "grad_accumulation_fusion",
                        static_cast<int64_t>(config.train.grad_accumulation_fusion));
  writer_.set_attribute("/", "backend", backend);
  writer_.set_attribute("/", "generator",
                        std::string("touchstone ") + TOUCHSTONE_VERSION + " (" + TOUCHSTONE_GIT_COMMIT + ")");
}

void GoldenWriter::write_tensors(const std::string& group, const ParamTensors& tensors) {
  for (int id = 0; id < table_.size(); ++id) {
    const std::string path = group + "/" + table_[id].name;
    if (precision_ == "fp64") {
      writer_.write_f64(path, tensors[id].data(), table_[id].shape);
    } else {
      writer_.write_f32(path, tensors[id].data(), table_[id].shape);
    }
  }
}

void GoldenWriter::write_step(const StepRecord& record, const ParamTensors& grads, const ParamTensors& params,
                              const AdamWState* moments) {
  const std::string group = "/steps/" + std::to_string(record.step);
  writer_.write_scalar_f64(group + "/loss", record.loss);
  writer_.write_scalar_i64(group + "/num_loss_tokens", record.num_loss_tokens);
  writer_.write_scalar_f64(group + "/grad_norm", record.grad_norm);
  writer_.write_scalar_f64(group + "/lr", record.lr);
  writer_.write_f64(group + "/token_losses", record.token_losses.data(), {windows_, seq_});
  write_tensors(group + "/grads", grads);
  write_tensors(group + "/params", params);
  if (options_.save_optimizer_state && moments) {
    write_tensors(group + "/optimizer/exp_avg", moments->exp_avg);
    write_tensors(group + "/optimizer/exp_avg_sq", moments->exp_avg_sq);
  }
}

std::array<double, 2> envelope_error(const std::vector<double>& low, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0, max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = low[i] - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
    max_diff = std::max(max_diff, std::abs(d));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  return {norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff), max_ref > 0 ? max_diff / max_ref : max_diff};
}

void GoldenWriter::write_envelope(const std::string& path, const std::vector<double>& low,
                                  const std::vector<double>& ref) {
  const std::array<double, 2> error = envelope_error(low, ref);
  const double tolerance[2] = {envelope_.k * error[0] + envelope_.floor,
                               envelope_.k * error[1] + envelope_.floor};
  writer_.write_f64("/envelope/error/" + path, error.data(), {2});
  writer_.write_f64("/envelope/tolerance/" + path, tolerance, {2});
}

void GoldenWriter::write_envelope_step(const StepRecord& low, const ParamTensors& low_grads,
                                       const ParamTensors& low_params, const StepRecord& ref,
                                       const ParamTensors& ref_grads, const ParamTensors& ref_params) {
  const std::string step = "steps/" + std::to_string(ref.step);
  write_envelope(step + "/loss", {low.loss}, {ref.loss});
  write_envelope(step + "/num_loss_tokens", {static_cast<double>(low.num_loss_tokens)},
                 {static_cast<double>(ref.num_loss_tokens)});
  write_envelope(step + "/grad_norm", {low.grad_norm}, {ref.grad_norm});
  write_envelope(step + "/lr", {low.lr}, {ref.lr});
  write_envelope(step + "/token_losses", low.token_losses, ref.token_losses);
  for (int id = 0; id < table_.size(); ++id) {
    write_envelope(step + "/grads/" + table_[id].name, low_grads[id], ref_grads[id]);
    write_envelope(step + "/params/" + table_[id].name, low_params[id], ref_params[id]);
  }
}

void GoldenWriter::write_tolerance_model(const Config& measured) {
  const nlohmann::json model = {{"kind", "envelope"},
                                {"precision", measured.precision},
                                {"grad_accumulation_fusion", measured.train.grad_accumulation_fusion},
                                {"k", envelope_.k},
                                {"floor", envelope_.floor}};
  writer_.set_attribute("/", "tolerance_model", model.dump());
}

void GoldenWriter::commit() { writer_.commit(); }

}  // namespace touchstone
