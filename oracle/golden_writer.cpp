// Golden-file layout: root attributes, /batch, /params/init and one group per step.
#include "oracle/golden_writer.h"

namespace touchstone {

namespace {

constexpr int64_t kFormatVersion = 1;

// The four [S, B, T] batch datasets, rows in global sample order.
void write_batches(h5::H5Writer& writer, const std::vector<GlobalBatch>& batches) {
  const auto steps = static_cast<int64_t>(batches.size());
  const int64_t B = batches.front().windows, T = batches.front().seq;
  auto stack = [&](auto member) {
    std::vector<int32_t> all;
    for (const GlobalBatch& batch : batches) all.insert(all.end(), (batch.*member).begin(), (batch.*member).end());
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
                           const GoldenOptions& options)
    : writer_(path),
      table_(table),
      precision_(config.precision),
      options_(options),
      windows_(batches.front().windows),
      seq_(batches.front().seq) {
  write_batches(writer_, batches);
  write_tensors("/params/init", initial_params);
  writer_.set_attribute("/", "format", std::string("touchstone-golden"));
  writer_.set_attribute("/", "format_version", kFormatVersion);
  writer_.set_attribute("/", "precision", config.precision);
  writer_.set_attribute("/", "loss_normalization", config.train.loss_normalization);
  writer_.set_attribute("/", "config", to_json(config).dump());
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

void GoldenWriter::commit() { writer_.commit(); }

}  // namespace touchstone
