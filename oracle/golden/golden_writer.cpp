// Golden-file layout: root attributes, /batch, /params/init and one group per step.
#include "oracle/golden/golden_writer.h"

#include <algorithm>
#include <cmath>

#include "common/version.h"
#include "data/sampler_order.h"

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

std::vector<double> position_loss_weights(const Config& config, const GlobalBatch& batch) {
  const int64_t mbs = config.train.micro_batch_size, T = batch.seq;
  const std::vector<int64_t> starts = micro_batch_starts(batch.windows, mbs, 1, 0);
  const std::vector<double> weights =
      loss_scaling(batch, starts, mbs, batch.loss_tokens(0, batch.windows), config.train.loss_normalization)
          .loss_weights;
  std::vector<double> per_position(static_cast<size_t>(batch.windows * T), 0.0);
  for (size_t j = 0; j < starts.size(); ++j) {
    for (int64_t i = starts[j] * T; i < (starts[j] + mbs) * T; ++i) {
      const auto at = static_cast<size_t>(i);
      if (batch.targets[at] != -100) per_position[at] = weights[j];
    }
  }
  return per_position;
}

double loss_envelope_error(const std::vector<double>& weights, const std::vector<double>& low_token_losses,
                           const std::vector<double>& token_losses, double low_loss, double loss) {
  double spread = 0.0;
  for (size_t i = 0; i < weights.size() && i < token_losses.size(); ++i) {
    spread += weights[i] * std::abs(low_token_losses[i] - token_losses[i]);
  }
  const double scale = loss != 0 ? std::abs(loss) : 1.0;
  return std::max(spread, std::abs(low_loss - loss)) / scale;
}

double grad_norm_envelope_error(const ParamTensors& low_grads, const ParamTensors& grads, double low_norm,
                                double norm) {
  double difference = 0.0;
  for (size_t t = 0; t < grads.tensors.size(); ++t) {
    for (size_t i = 0; i < grads.tensors[t].size(); ++i) {
      const double d = low_grads.tensors[t][i] - grads.tensors[t][i];
      difference += d * d;
    }
  }
  const double scale = norm != 0 ? std::abs(norm) : 1.0;
  return std::max(std::sqrt(difference), std::abs(low_norm - norm)) / scale;
}

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
  for (const GlobalBatch& batch : batches) position_weights_.push_back(position_loss_weights(config, batch));
  write_tensors("/params/init", initial_params);
  writer_.set_attribute("/", "format", std::string("touchstone-golden"));
  writer_.set_attribute("/", "format_version", kFormatVersion);
  writer_.set_attribute("/", "precision", option_name(config.precision));
  writer_.set_attribute("/", "loss_normalization", option_name(config.train.loss_normalization));
  writer_.set_attribute("/", "config", to_json(config).dump());
  // How a comparison decides pass or fail when nothing better is known (docs/golden-format.md).
  writer_.set_attribute("/", "tolerance_model",
                        config.precision == Precision::kFp64
                            ? std::string(R"({"kind": "fp64", "relative_l2": 1e-10})")
                            : std::string(R"({"kind": "unspecified"})"));
  writer_.set_attribute("/", "grad_accumulation_fusion",
                        static_cast<int64_t>(config.train.grad_accumulation_fusion));
  writer_.set_attribute("/", "backend", backend);
  writer_.set_attribute("/", "generator", generator_string());
}

void GoldenWriter::write_tensors(const std::string& group, const ParamTensors& tensors) {
  for (int id = 0; id < table_.size(); ++id) {
    const std::string path = group + "/" + table_[id].name;
    if (precision_ == Precision::kFp64) {
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
  // The largest element error is one sample, and it can be small by luck: the elements that carry the
  // run's biggest errors need not be where another implementation's are. It is therefore taken no smaller
  // than the largest of n errors of the measured root-mean-square size, spread evenly (the expected
  // maximum of n Gaussian errors, rms * sqrt(2 ln n)); a single scalar (n = 1) keeps its own error.
  const double n = static_cast<double>(ref.size());
  const double spread_max = n > 1 ? std::sqrt(diff / n) * std::sqrt(2.0 * std::log(n)) : 0.0;
  const double largest = std::max(max_diff, spread_max);
  return {norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff), max_ref > 0 ? largest / max_ref : largest};
}

void GoldenWriter::write_envelope(const std::string& path, const std::vector<double>& low,
                                  const std::vector<double>& ref) {
  write_envelope(path, envelope_error(low, ref));
}

void GoldenWriter::write_envelope(const std::string& path, const std::array<double, 2>& error) {
  const double tolerance[2] = {envelope_.k * error[0] + envelope_.floor,
                               envelope_.k * error[1] + envelope_.floor};
  writer_.write_f64("/envelope/error/" + path, error.data(), {2});
  writer_.write_f64("/envelope/tolerance/" + path, tolerance, {2});
}

void GoldenWriter::write_envelope_step(const StepRecord& low, const ParamTensors& low_grads,
                                       const ParamTensors& low_params, const StepRecord& ref,
                                       const ParamTensors& ref_grads, const ParamTensors& ref_params) {
  const std::string step = "steps/" + std::to_string(ref.step);
  const double loss_error = loss_envelope_error(position_weights_[static_cast<size_t>(ref.step - 1)],
                                                low.token_losses, ref.token_losses, low.loss, ref.loss);
  write_envelope(step + "/loss", {loss_error, loss_error});
  write_envelope(step + "/num_loss_tokens", {static_cast<double>(low.num_loss_tokens)},
                 {static_cast<double>(ref.num_loss_tokens)});
  const double norm_error = grad_norm_envelope_error(low_grads, ref_grads, low.grad_norm, ref.grad_norm);
  write_envelope(step + "/grad_norm", {norm_error, norm_error});
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
