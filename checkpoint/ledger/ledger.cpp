// Reading and appending the sample ledger and faults.jsonl (format in ledger.h).
#include "checkpoint/ledger/ledger.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/errors.h"
#include "common/text_output.h"

namespace touchstone::ledger {

namespace {

using nlohmann::json;

// Field access for one line, every error naming the file and line.
class LineFields {
 public:
  LineFields(const std::string& path, int line, const json& object)
      : path_(path), line_(line), object_(object) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw InputError(path_ + ":" + std::to_string(line_) + ": " + message);
  }

  bool has(const char* key) const { return object_.contains(key); }

  const json& field(const char* key) const {
    const auto it = object_.find(key);
    if (it == object_.end()) fail(std::string("missing \"") + key + "\"");
    return *it;
  }

  int64_t integer(const char* key) const {
    const json& value = field(key);
    if (!value.is_number_integer()) fail(std::string("\"") + key + "\" is not an integer");
    return value.get<int64_t>();
  }

  int64_t non_negative(const char* key) const {
    const int64_t value = integer(key);
    if (value < 0) fail(std::string("\"") + key + "\" is negative");
    return value;
  }

  int positive_int(const char* key) const {
    const int64_t value = integer(key);
    if (value < 1 || value > (int64_t{1} << 30))
      fail(std::string("\"") + key + "\" must be a positive integer");
    return static_cast<int>(value);
  }

  double number(const char* key) const {
    const json& value = field(key);
    if (!value.is_number()) fail(std::string("\"") + key + "\" is not a number");
    return value.get<double>();
  }

  std::string string(const char* key) const {
    const json& value = field(key);
    if (!value.is_string()) fail(std::string("\"") + key + "\" is not a string");
    return value.get<std::string>();
  }

  std::vector<std::vector<int64_t>> sample_lists(const char* key) const {
    const json& value = field(key);
    const auto bad = [&] { fail(std::string("\"") + key + "\" is not a list of lists of sample indices"); };
    if (!value.is_array()) bad();
    std::vector<std::vector<int64_t>> lists;
    for (const json& list : value) {
      if (!list.is_array()) bad();
      std::vector<int64_t>& samples = lists.emplace_back();
      for (const json& sample : list) {
        if (!sample.is_number_integer() || sample.get<int64_t>() < 0) bad();
        samples.push_back(sample.get<int64_t>());
      }
    }
    return lists;
  }

 private:
  const std::string& path_;
  int line_;
  const json& object_;
};

Event parse_event(const LineFields& fields) {
  Event event;
  const std::string kind = fields.string("event");
  event.attempt = fields.positive_int("attempt");
  event.time = fields.number("time");
  if (kind == "start") {
    event.kind = EventKind::kStart;
    StartInfo& s = event.start;
    s.resumed_from_step = fields.non_negative("resumed_from_step");
    s.layout.world_size = fields.positive_int("world_size");
    s.layout.tp = fields.positive_int("tp");
    if (fields.has("cp")) s.layout.cp = fields.positive_int("cp");
    s.layout.pp = fields.positive_int("pp");
    s.layout.dp = fields.positive_int("dp");
    s.layout.global_batch_size = fields.positive_int("global_batch_size");
    s.layout.micro_batch_size = fields.positive_int("micro_batch_size");
    s.num_windows = fields.positive_int("num_windows");
    s.steps = fields.non_negative("steps");
    if (fields.has("data_fingerprint")) event.data_fingerprint = fields.string("data_fingerprint");
  } else if (kind == "step") {
    event.kind = EventKind::kStep;
    event.step = fields.positive_int("step");
    event.samples = fields.sample_lists("samples");
  } else if (kind == "checkpoint") {
    event.kind = EventKind::kCheckpoint;
    event.step = fields.non_negative("step");
    event.path = fields.string("path");
    if (fields.has("recovered_by")) event.recovered_by = fields.positive_int("recovered_by");
  } else if (kind == "end") {
    event.kind = EventKind::kEnd;
    event.step = fields.non_negative("steps");
  } else {
    fields.fail("unknown event \"" + kind + "\"");
  }
  return event;
}

// Calls `on_line(fields)` for every complete line of a JSON Lines file; an unterminated last line is
// a write cut short by a kill, reported through `notes` and otherwise ignored.
template <typename OnLine>
void read_json_lines(const std::string& path, std::vector<std::string>& notes, OnLine on_line) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::string text;
  int line = 0;
  while (std::getline(in, text)) {
    ++line;
    // getline sets eof only when the line ended without '\n', i.e. it is the file's torn tail.
    if (in.eof()) {
      notes.push_back(path + ":" + std::to_string(line) +
                      ": unterminated last line (a write cut short) ignored");
      break;
    }
    const json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
    const LineFields fields(path, line, object);
    if (object.is_discarded()) fields.fail("not valid JSON");
    if (!object.is_object()) fields.fail("not a JSON object");
    on_line(fields, line);
  }
}

void write_whole(int fd, const std::string& text, const std::string& path) {
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(path + ": cannot append (" + std::strerror(errno) + ")");
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) throw std::runtime_error(path + ": cannot sync (" + std::strerror(errno) + ")");
}

// Cuts the file after its last '\n', dropping a line whose write was cut short.
void drop_torn_tail(int fd, const std::string& path) {
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    throw std::runtime_error(path + ": cannot stat (" + std::strerror(errno) + ")");
  off_t end = info.st_size;
  char buffer[4096];
  while (end > 0) {
    const off_t begin =
        end > static_cast<off_t>(sizeof(buffer)) ? end - static_cast<off_t>(sizeof(buffer)) : 0;
    const ssize_t n = ::pread(fd, buffer, static_cast<size_t>(end - begin), begin);
    if (n != end - begin) throw std::runtime_error(path + ": cannot read its last line");
    for (ssize_t i = n - 1; i >= 0; --i) {
      if (buffer[i] != '\n') continue;
      const off_t keep = begin + i + 1;
      if (keep != info.st_size && ::ftruncate(fd, keep) != 0) {
        throw std::runtime_error(path + ": cannot cut its torn last line (" + std::strerror(errno) + ")");
      }
      return;
    }
    end = begin;
  }
  if (info.st_size > 0 && ::ftruncate(fd, 0) != 0) {
    throw std::runtime_error(path + ": cannot cut its torn last line (" + std::strerror(errno) + ")");
  }
}

// Makes a newly created file's directory entry durable.
void sync_directory_of(const std::string& path) {
  try {
    sync_directory(std::filesystem::absolute(path).parent_path().string());
  } catch (const std::runtime_error&) {
    // the lines themselves are synced; losing the entry needs a crash right now
  }
}

}  // namespace

Ledger read_ledger(const std::string& path) {
  Ledger ledger;
  ledger.path = path;
  read_json_lines(path, ledger.notes, [&](const LineFields& fields, int line) {
    Event event = parse_event(fields);
    event.line = line;
    ledger.events.push_back(std::move(event));
  });
  return ledger;
}

std::vector<InjectedFailure> read_faults(const std::string& path) {
  std::vector<InjectedFailure> failures;
  std::vector<std::string> notes;
  read_json_lines(path, notes, [&](const LineFields& fields, int) {
    if (fields.string("event") != "injected_failure")
      fields.fail("unknown event (expected \"injected_failure\")");
    failures.push_back(InjectedFailure{fields.non_negative("step"),
                                       static_cast<int>(fields.non_negative("rank")), fields.string("phase"),
                                       fields.number("time")});
  });
  return failures;
}

void append_injected_failure(const std::string& path, const InjectedFailure& failure) {
  // Read and write: a torn last line (a record whose writer was killed mid-write) is cut off first, as
  // the ledger's writer does, so this record starts a line of its own instead of being glued onto the
  // fragment into one line that no reader can parse.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) + ")");
  const json line{{"event", "injected_failure"},
                  {"step", failure.step},
                  {"rank", failure.rank},
                  {"phase", failure.phase},
                  {"time", failure.time}};
  try {
    drop_torn_tail(fd, path);
    write_whole(fd, line.dump() + "\n", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::string ledger_path(const std::string& file_or_directory) {
  if (std::filesystem::is_directory(file_or_directory)) {
    return (std::filesystem::path(file_or_directory) / kLedgerFileName).string();
  }
  return file_or_directory;
}

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

LedgerWriter::LedgerWriter(const std::string& path) : path_(path) {
  const bool existed = std::filesystem::exists(path);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw InputError(path + ": cannot open the ledger for appending (" + std::strerror(errno) + ")");
  try {
    if (!existed) sync_directory_of(path);
    drop_torn_tail(fd_, path);
    int starts = 0;
    for (const Event& event : read_ledger(path).events) {
      switch (event.kind) {
        case EventKind::kStart:
          ++starts;
          history_.last_attempt = event.attempt;
          history_.last_attempt_ended = false;
          history_.last_step = 0;
          break;
        case EventKind::kStep:
          history_.last_step = event.step;
          break;
        case EventKind::kCheckpoint:
          history_.checkpoints.push_back(event.step);
          break;
        case EventKind::kEnd:
          history_.last_attempt_ended = true;
          break;
      }
    }
    attempt_ = starts + 1;
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

LedgerWriter::~LedgerWriter() { ::close(fd_); }

void LedgerWriter::append(const std::string& line) { write_whole(fd_, line + "\n", path_); }

bool LedgerWriter::record_recovered_checkpoint(int64_t step, const std::string& checkpoint_path) {
  const History& h = history_;
  const bool recorded = std::find(h.checkpoints.begin(), h.checkpoints.end(), step) != h.checkpoints.end();
  // Only the commit the last attempt was making when it died: any other gap is the check's to report.
  if (recorded || h.last_attempt == 0 || h.last_attempt_ended || h.last_step != step) return false;
  append(json{{"event", "checkpoint"},
              {"attempt", h.last_attempt},
              {"step", step},
              {"time", unix_time_now()},
              {"path", checkpoint_path},
              {"recovered_by", attempt_}}
             .dump());
  history_.checkpoints.push_back(step);
  return true;
}

void LedgerWriter::start(const StartInfo& info, const std::string& data_fingerprint) {
  json line{{"event", "start"},
            {"attempt", attempt_},
            {"time", unix_time_now()},
            {"resumed_from_step", info.resumed_from_step},
            {"world_size", info.layout.world_size},
            {"tp", info.layout.tp},
            {"cp", info.layout.cp},
            {"pp", info.layout.pp},
            {"dp", info.layout.dp},
            {"global_batch_size", info.layout.global_batch_size},
            {"micro_batch_size", info.layout.micro_batch_size},
            {"num_windows", info.num_windows},
            {"steps", info.steps}};
  if (!data_fingerprint.empty()) line["data_fingerprint"] = data_fingerprint;
  append(line.dump());
}

void LedgerWriter::step(int64_t step, const std::vector<std::vector<int64_t>>& samples_per_dp_rank,
                        const StepTotals* totals) {
  json line{{"event", "step"},
            {"attempt", attempt_},
            {"step", step},
            {"time", unix_time_now()},
            {"samples", samples_per_dp_rank}};
  if (totals) {  // nlohmann writes doubles with enough digits to read back the same bits
    line["loss"] = totals->loss;
    line["num_loss_tokens"] = totals->num_loss_tokens;
    line["grad_norm"] = totals->grad_norm;
    line["lr"] = totals->lr;
  }
  append(line.dump());
}

void LedgerWriter::checkpoint(int64_t step, const std::string& checkpoint_path) {
  append(json{{"event", "checkpoint"},
              {"attempt", attempt_},
              {"step", step},
              {"time", unix_time_now()},
              {"path", checkpoint_path}}
             .dump());
}

void LedgerWriter::end(int64_t steps_completed) {
  append(json{{"event", "end"}, {"attempt", attempt_}, {"time", unix_time_now()}, {"steps", steps_completed}}
             .dump());
}

}  // namespace touchstone::ledger
