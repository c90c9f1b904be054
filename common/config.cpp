// Config resolution: defaults <- config file <- section.key=value overrides, with every key and type
// checked.
#include "common/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/errors.h"

namespace touchstone {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelConfig, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads,
                                   ffn_hidden_size, seq_length, norm_eps, rope_theta, tie_embeddings,
                                   init_std, attention_dropout, hidden_dropout)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DataConfig, source, eos_token, pad_token, eos_loss, document_masking)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TrainConfig, global_batch_size, micro_batch_size, steps, seed,
                                   loss_normalization, grad_accumulation_fusion)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EnvelopeConfig, k, floor)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OptimConfig, lr, min_lr, warmup_steps, decay_steps, warmup_init,
                                   schedule_convention, beta1, beta2, eps, weight_decay, clip_grad)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ParallelConfig, tp, pp, dp, cp, cp_comm, schedule, sequence_parallel,
                                   distributed_optimizer, zero_stage, virtual_stages, stage_layers)

nlohmann::json to_json(const Config& config) {
  return nlohmann::json{{"model", config.model},       {"data", config.data},
                        {"train", config.train},       {"optim", config.optim},
                        {"parallel", config.parallel}, {"precision", config.precision},
                        {"envelope", config.envelope}};
}

nlohmann::json default_config_json() { return to_json(Config{}); }

const std::vector<IntegerLimit>& integer_limits() {
  static const std::vector<IntegerLimit> limits{
      {"model.vocab_size", 3, kMaxCount},
      {"model.hidden_size", 2, kMaxCount},
      {"model.num_layers", 1, kMaxCount},
      {"model.num_heads", 1, kMaxCount},
      {"model.num_kv_heads", 1, kMaxCount},
      {"model.ffn_hidden_size", 1, kMaxCount},
      {"model.seq_length", 1, kMaxCount},
      {"data.eos_token", 0, kMaxCount},
      {"data.pad_token", 0, kMaxCount},
      {"train.global_batch_size", 1, kMaxCount},
      {"train.micro_batch_size", 1, kMaxCount},
      {"train.steps", 1, kMaxCount},
      {"train.seed", 0, std::numeric_limits<int64_t>::max()},
      {"optim.warmup_steps", 0, kMaxCount},
      {"optim.decay_steps", 0, kMaxCount},
      {"parallel.tp", 1, kMaxProcesses},
      {"parallel.pp", 1, kMaxProcesses},
      {"parallel.dp", 1, kMaxProcesses},
      {"parallel.cp", 1, kMaxProcesses},
      {"parallel.zero_stage", 0, 3},
      {"parallel.virtual_stages", 1, kMaxProcesses},
      {"parallel.stage_layers", 1, kMaxCount},
  };
  return limits;
}

namespace {

std::string type_name(const nlohmann::json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_boolean()) return "a boolean";
  if (value.is_array()) return "a list of integers";
  if (value.is_string()) return "a string";
  if (value.is_object()) return "an object";
  return std::string("a ") + value.type_name();
}

// A value as a message quotes it: at most 40 characters, so that every message stays one short line.
std::string quoted(const nlohmann::json& value) {
  const std::string text = value.dump();
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

const IntegerLimit* find_limit(const std::string& key) {
  for (const IntegerLimit& limit : integer_limits()) {
    if (key == limit.key) return &limit;
  }
  return nullptr;
}

// "config: model.num_layers must be in [1, 2147483647] (got 1000000000000)": one line naming the key.
std::string range_message(const IntegerLimit& limit, const std::string& got) {
  return std::string(limit.key) + " must be in [" + std::to_string(limit.min) + ", " +
         std::to_string(limit.max) + "] (got " + got + ")";
}

// An integer above INT64_MAX reads as a negative int64_t; refuse it as it was written. A string holding
// NUL would name one file in the config and open another (C paths end at the first NUL).
void check_value(const nlohmann::json& value, const std::string& path, const std::string& origin) {
  const auto refuse_integer = [&](const nlohmann::json& integer) {
    const IntegerLimit* limit = find_limit(path);
    throw InputError(origin + ": " +
                     (limit ? range_message(*limit, quoted(integer))
                            : path + " must be below 2^63 (got " + quoted(integer) + ")"));
  };
  const uint64_t int64_max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (value.is_number_unsigned() && value.get<uint64_t>() > int64_max) refuse_integer(value);
  if (value.is_array()) {
    for (const auto& element : value) {
      if (element.is_number_unsigned() && element.get<uint64_t>() > int64_max) refuse_integer(element);
    }
  }
  if (value.is_string() && value.get_ref<const std::string&>().find('\0') != std::string::npos) {
    throw InputError(origin + ": " + path + " must not contain a NUL character");
  }
}

// A value may replace a default only if it has the default's type; integers are accepted for floats.
bool same_kind(const nlohmann::json& default_value, const nlohmann::json& value) {
  if (default_value.is_number_integer()) return value.is_number_integer();
  if (default_value.is_number_float()) return value.is_number();
  if (default_value.is_array()) {  // the only list keys hold integers (parallel.stage_layers)
    return value.is_array() &&
           std::all_of(value.begin(), value.end(), [](const auto& v) { return v.is_number_integer(); });
  }
  return default_value.type() == value.type();
}

void merge_checked(nlohmann::json& target, const nlohmann::json& source, const std::string& prefix,
                   const std::string& origin) {
  if (!source.is_object()) {
    throw InputError(origin + ": " + (prefix.empty() ? "the config" : prefix) + " must be a JSON object");
  }
  for (const auto& [key, value] : source.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (!target.contains(key)) throw InputError(origin + ": unknown config key '" + path + "'");
    nlohmann::json& slot = target[key];
    if (slot.is_object()) {
      merge_checked(slot, value, path, origin);
    } else if (!same_kind(slot, value)) {
      throw InputError(origin + ": " + path + " must be " + type_name(slot) + ", got " + quoted(value));
    } else {
      check_value(value, path, origin);
      slot = slot.is_number_float() ? nlohmann::json(value.get<double>()) : value;
    }
  }
}

// How an override's errors begin: "override 'model.x=1': ". The command line that took the override
// from a flag can name the flag instead (it knows the assignment it passed).
std::string override_origin(const std::string& assignment) { return "override '" + assignment + "'"; }

// "model.hidden_size=32" -> {"model": {"hidden_size": 32}}. The value is JSON when it parses as JSON
// of the key's type, and a plain string otherwise (so data.source=docs.jsonl needs no quotes).
nlohmann::json override_as_json(const std::string& assignment, const nlohmann::json& defaults) {
  const std::string origin = override_origin(assignment);
  const auto equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw InputError(origin + ": expected section.key=value");
  }
  const std::string path = assignment.substr(0, equals);
  const std::string text = assignment.substr(equals + 1);
  const nlohmann::json* default_value = &defaults;
  std::vector<std::string> keys;
  std::stringstream stream(path);
  for (std::string key; std::getline(stream, key, '.');) {
    if (!default_value->is_object() || !default_value->contains(key)) {
      throw InputError(origin + ": unknown config key '" + path + "'");
    }
    default_value = &(*default_value)[key];
    keys.push_back(key);
  }
  if (default_value->is_object()) throw InputError(origin + ": '" + path + "' is a section, not a key");
  // A command-line argument need not be UTF-8, but the config is JSON text (messages, golden files).
  try {
    (void)nlohmann::json(text).dump();
  } catch (const nlohmann::json::type_error&) {
    throw InputError(origin + ": the value is not valid UTF-8");
  }
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded() || (default_value->is_string() && !value.is_string())) value = text;
  nlohmann::json result = value;
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) result = nlohmann::json{{*key, result}};
  return result;
}

}  // namespace

nlohmann::json read_config_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw InputError(path + ": cannot open config file");
  nlohmann::json parsed = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) throw InputError(path + ": not valid JSON");
  return parsed;
}

// The string options (options.h) become enums here, in get<>: a name their table does not hold is
// refused now, so nothing after loading compares strings.
Config resolve_config(const nlohmann::json& file_json, const std::vector<std::string>& overrides,
                      const std::string& origin) {
  nlohmann::json resolved = default_config_json();
  if (!file_json.is_null()) merge_checked(resolved, file_json, "", origin);
  for (const std::string& assignment : overrides) {
    merge_checked(resolved, override_as_json(assignment, resolved), "", override_origin(assignment));
  }
  Config config;
  config.model = resolved["model"].get<ModelConfig>();
  config.data = resolved["data"].get<DataConfig>();
  config.train = resolved["train"].get<TrainConfig>();
  config.optim = resolved["optim"].get<OptimConfig>();
  config.parallel = resolved["parallel"].get<ParallelConfig>();
  // One knob from here on: the distributed optimizer is ZeRO stage 1, and every stage shards the optimizer.
  if (config.parallel.distributed_optimizer && config.parallel.zero_stage == 0)
    config.parallel.zero_stage = 1;
  config.parallel.distributed_optimizer = config.parallel.zero_stage >= 1;
  config.precision = resolved["precision"].get<Precision>();
  config.envelope = resolved["envelope"].get<EnvelopeConfig>();
  return config;
}

namespace {

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw InputError("config: " + key + " " + what);
}

std::string str(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Every integer key within its limits, and every float key finite, before any check multiplies or
// divides them: the cross-key checks below then cannot overflow (each count < 2^31, each process
// count < 2^20), and a value far outside its range is reported as such, not as a divisibility problem.
void check_ranges(const Config& c) {
  const nlohmann::json json = to_json(c);
  for (const IntegerLimit& limit : integer_limits()) {
    std::string pointer = "/" + std::string(limit.key);
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    const nlohmann::json& value = json.at(nlohmann::json::json_pointer(pointer));
    for (const nlohmann::json& entry : value.is_array() ? value : nlohmann::json::array({value})) {
      const auto number = entry.get<int64_t>();
      require(number >= limit.min && number <= limit.max, limit.key,
              range_message(limit, std::to_string(number)).substr(std::string(limit.key).size() + 1));
    }
  }
  for (const auto& [section, keys] : json.items()) {
    if (!keys.is_object()) continue;
    for (const auto& [key, value] : keys.items()) {
      if (!value.is_number_float()) continue;
      const auto number = value.get<double>();
      require(std::isfinite(number), section + "." + key,
              "must be a finite number (got " + str(number) + ")");
    }
  }
}

}  // namespace

bool context_parallel_fits_window(int64_t cp, int64_t seq_length) {
  return cp == 1 || seq_length % (2 * cp) == 0;
}

void validate_config(const Config& c, int world_size) {
  check_ranges(c);
  const ModelConfig& m = c.model;
  require(m.hidden_size % m.num_heads == 0, "model.hidden_size",
          "(" + std::to_string(m.hidden_size) + ") must be divisible by model.num_heads (" +
              std::to_string(m.num_heads) + ")");
  require(
      m.head_dim() % 2 == 0, "model.hidden_size",
      "/ model.num_heads = head_dim " + std::to_string(m.head_dim()) + " must be even (RoPE rotates pairs)");
  require(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
          "(" + std::to_string(m.num_kv_heads) + ") must be >= 1 and divide model.num_heads (" +
              std::to_string(m.num_heads) + ")");
  require(m.norm_eps > 0, "model.norm_eps", "must be > 0 (got " + str(m.norm_eps) + ")");
  require(m.rope_theta > 0, "model.rope_theta", "must be > 0");
  require(m.init_std >= 0, "model.init_std", "must be >= 0");
  require(m.attention_dropout >= 0 && m.attention_dropout < 1, "model.attention_dropout",
          "must be in [0, 1) (got " + str(m.attention_dropout) + ")");
  require(m.hidden_dropout >= 0 && m.hidden_dropout < 1, "model.hidden_dropout",
          "must be in [0, 1) (got " + str(m.hidden_dropout) + ")");

  const DataConfig& d = c.data;
  require(!d.source.empty(), "data.source", "must not be empty");
  require(d.eos_token >= 0 && d.eos_token < m.vocab_size, "data.eos_token",
          "(" + std::to_string(d.eos_token) + ") must be in [0, model.vocab_size)");
  require(d.pad_token >= 0 && d.pad_token < m.vocab_size, "data.pad_token",
          "(" + std::to_string(d.pad_token) + ") must be in [0, model.vocab_size)");
  require(d.pad_token != d.eos_token, "data.pad_token", "must differ from data.eos_token");

  const TrainConfig& t = c.train;
  const ParallelConfig& p = c.parallel;
  require(t.global_batch_size % (t.micro_batch_size * p.dp) == 0, "train.global_batch_size",
          "(" + std::to_string(t.global_batch_size) +
              ") must be divisible by parallel.dp x train.micro_batch_size (" + std::to_string(p.dp) + " x " +
              std::to_string(t.micro_batch_size) + ")");

  const OptimConfig& o = c.optim;
  require(o.lr >= 0, "optim.lr", "must be >= 0");
  require(o.min_lr >= 0, "optim.min_lr", "must be >= 0");
  require(o.decay_steps >= o.warmup_steps, "optim.decay_steps", "must be >= optim.warmup_steps");
  require(o.warmup_init >= 0 && o.warmup_init <= o.lr, "optim.warmup_init",
          "must be in [0, optim.lr] (got " + str(o.warmup_init) + ")");
  // OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps (so lr_decay_steps > 0).
  require(
      o.schedule_convention != ScheduleConvention::kMegatron || o.decay_steps > o.warmup_steps,
      "optim.decay_steps",
      "must be > optim.warmup_steps under optim.schedule_convention \"megatron\" (Megatron-LM requires its "
      "lr-decay-iters > lr-warmup-iters)");
  require(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1", "must be in [0, 1)");
  require(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2", "must be in [0, 1)");
  require(o.eps > 0, "optim.eps", "must be > 0");
  require(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0");
  require(o.clip_grad >= 0, "optim.clip_grad", "must be >= 0 (0 disables clipping)");

  require(m.num_heads % p.tp == 0 && m.num_kv_heads % p.tp == 0, "parallel.tp",
          "(" + std::to_string(p.tp) + ") must divide model.num_heads and model.num_kv_heads");
  require(m.ffn_hidden_size % p.tp == 0, "parallel.tp", "must divide model.ffn_hidden_size");
  require(m.vocab_size % p.tp == 0, "parallel.tp", "must divide model.vocab_size");
  const int64_t chunks = p.num_virtual_stages();  // overflow-free: both are at most kMaxProcesses
  const std::string cut = p.virtual_stages == 1 ? "parallel.pp" : "parallel.pp x parallel.virtual_stages";
  if (p.stage_layers.empty()) {
    require(m.num_layers % chunks == 0, p.virtual_stages == 1 ? "parallel.pp" : "parallel.virtual_stages",
            "(" + (p.virtual_stages == 1 ? "" : cut + " = ") + std::to_string(chunks) +
                ") must divide model.num_layers (" + std::to_string(m.num_layers) +
                ") unless parallel.stage_layers lists the layers of each " +
                (p.virtual_stages == 1 ? "stage" : "virtual stage"));
  } else {
    int64_t total = 0;
    for (int64_t layers : p.stage_layers) {
      total += layers;
    }
    require(static_cast<int64_t>(p.stage_layers.size()) == chunks, "parallel.stage_layers",
            "has " + std::to_string(p.stage_layers.size()) + " entries but " + cut + " is " +
                std::to_string(chunks));
    require(total == m.num_layers, "parallel.stage_layers",
            "sums to " + std::to_string(total) + " but model.num_layers is " + std::to_string(m.num_layers));
  }
  if (p.virtual_stages > 1) {
    // Megatron-LM's forward_backward_pipelining_with_interleaving, with its default micro-batch group
    // of pp: the micro-batches run through the chunks in groups of pp (parallel/pipeline/schedule.h).
    const int64_t per_rank = t.global_batch_size / (t.micro_batch_size * p.dp);
    require(p.pp >= 2, "parallel.virtual_stages",
            "> 1 needs parallel.pp >= 2 (it interleaves pipeline stages)");
    require(p.schedule == PipelineSchedule::kOneForwardOneBackward, "parallel.virtual_stages",
            "> 1 runs interleaved 1F1B: parallel.schedule must be \"1f1b\"");
    require(per_rank % p.pp == 0, "parallel.virtual_stages",
            "> 1 needs the micro-batches per data-parallel rank (train.global_batch_size / "
            "(train.micro_batch_size "
            "x parallel.dp) = " +
                std::to_string(per_rank) + ") to be a multiple of parallel.pp (" + std::to_string(p.pp) +
                "), as Megatron-LM's interleaved schedule does");
  }
  require(context_parallel_fits_window(p.cp, m.seq_length), "parallel.cp",
          "(" + std::to_string(p.cp) + ") needs model.seq_length (" + std::to_string(m.seq_length) +
              ") divisible by 2 x parallel.cp: each cp rank holds two chunks of every window");
  require(!p.sequence_parallel || (m.seq_length / p.cp) % p.tp == 0, "parallel.sequence_parallel",
          p.cp == 1 ? "needs model.seq_length divisible by parallel.tp"
                    : "needs model.seq_length / parallel.cp divisible by parallel.tp");
  // Each factor is at most kMaxProcesses = 2^20, so the product of three fits in int64_t; a product of
  // four that would not is far above any world size.
  const int64_t three = p.tp * p.cp * p.pp;
  const bool fits = three <= std::numeric_limits<int64_t>::max() / p.dp;
  const std::string ranks = fits ? std::to_string(three * p.dp) : "more than 2^63";
  require(fits && three * p.dp == world_size, "parallel",
          "tp x cp x pp x dp = " + ranks + " but the run has " + std::to_string(world_size) +
              " process(es) (launch with mpirun -np " + ranks + ")");

  require(c.envelope.k >= 1, "envelope.k", "must be >= 1 (a tolerance below the measured error cannot pass)");
  require(c.envelope.floor >= 0, "envelope.floor", "must be >= 0");
}

int64_t ParallelConfig::world_size() const {
  int64_t processes = 1;
  for (const int64_t factor : {tp, cp, dp, pp})  // each product stays below 2^41: no overflow
    processes = std::min(processes * factor, kMaxProcesses + 1);
  return processes;
}

std::vector<int64_t> Config::stage_boundaries() const {
  std::vector<int64_t> boundaries{0};
  const int64_t chunks = parallel.num_virtual_stages();
  for (int64_t stage = 0; stage < chunks; ++stage) {
    const int64_t layers = parallel.stage_layers.empty() ? model.num_layers / chunks
                                                         : parallel.stage_layers[static_cast<size_t>(stage)];
    boundaries.push_back(boundaries.back() + layers);
  }
  return boundaries;
}

}  // namespace touchstone
