// The sample ledger: a JSON Lines record, appended by world rank 0, of which global samples every step
// consumed, which checkpoints were committed, and where each attempt of a run started and ended. A run
// that is killed and resumed keeps appending to the same file, so the ledger is the evidence that no
// sample was skipped or read twice across restarts (ledger_check.h verifies it; docs/recovery.md).
//
// One JSON object per line; every append is flushed and fsync'ed, so a killed writer leaves whole lines
// only, except possibly a torn last line, which readers ignore with a note.
//   {"event":"start","attempt":A,"time":T,"resumed_from_step":K,"world_size":N,"tp":..,"cp":..,"pp":..,"dp":..,
//    "global_batch_size":B,"micro_batch_size":M,"num_windows":W,"steps":S,"data_fingerprint":"fnv1a64:.."}
//   {"event":"step","attempt":A,"step":s,"time":T,"samples":[[dp rank 0's samples],[dp rank 1's],...],
//    "loss":L,"num_loss_tokens":N,"grad_norm":G,"lr":R}     (the last four written by the trainer)
//   {"event":"checkpoint","attempt":A,"step":s,"time":T,"path":"step_00000005"}
//   {"event":"checkpoint","attempt":A,"step":s,"time":T,"path":"step_00000005","recovered_by":A+1}
//     (a commit of attempt A whose line A was killed before writing, recorded by the next attempt from
//      the verified checkpoint it resumes from, just before its start line)
//   {"event":"end","attempt":A,"time":T,"steps":s}
// A fault-injected rank writes one line to faults.jsonl next to the ledger before it kills itself:
//   {"event":"injected_failure","step":s,"rank":r,"phase":"forward|backward|optimizer|save","time":T}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace touchstone::ledger {

constexpr const char* kLedgerFileName = "ledger.jsonl";
constexpr const char* kFaultsFileName = "faults.jsonl";

// The process layout and batch shape of one attempt; a restart may change any of them.
struct Layout {
  int world_size = 1;  // tp x cp x pp x dp (ParallelConfig::world_size)
  int tp = 1;
  int cp = 1;  // absent from ledgers written before context parallelism: 1
  int pp = 1;
  int dp = 1;
  int64_t global_batch_size = 1;  // B
  int64_t micro_batch_size = 1;   // M
  bool operator==(const Layout&) const = default;
};

// What an attempt announces when it starts.
struct StartInfo {
  int64_t resumed_from_step = 0;  // 0: a fresh start; else the step of the checkpoint loaded
  Layout layout;
  int64_t num_windows = 0;  // W: one epoch is W samples, sample k reads window k mod W
  int64_t steps = 0;        // the run's target number of steps
};

enum class EventKind { kStart, kStep, kCheckpoint, kEnd };

// One line of the ledger. Fields that do not belong to the event's kind keep their defaults.
struct Event {
  EventKind kind = EventKind::kStart;
  int attempt = 0;
  double time = 0.0;  // unix time, seconds
  int line = 0;       // 1-based line number in the file, for messages
  StartInfo start;    // kStart
  // kStart: the data set's content fingerprint (data::content_fingerprint); empty in ledgers written
  // before it was recorded.
  std::string data_fingerprint;
  int64_t step = 0;  // kStep, kCheckpoint; kEnd: the steps completed
  std::vector<std::vector<int64_t>>
      samples;           // kStep: per dp rank, global sample indices in the order consumed
  std::string path;      // kCheckpoint: the committed checkpoint, relative to the ledger's directory
  int recovered_by = 0;  // kCheckpoint: 0, or the attempt that recorded this commit from the disk
};

struct Ledger {
  std::string path;
  std::vector<Event> events;       // in file order
  std::vector<std::string> notes;  // what the reader tolerated (a torn last line)
};

// Reads a ledger. Throws InputError naming `file:line` for a line that is not a valid event, or when
// the file cannot be opened. An unterminated last line that does not parse is a write cut short by a
// kill: it is left out and noted in Ledger::notes.
Ledger read_ledger(const std::string& path);

// An injected failure recorded in faults.jsonl.
struct InjectedFailure {
  int64_t step = 0;
  int rank = 0;
  std::string phase;
  double time = 0.0;
};
// Reads faults.jsonl (same tolerance and errors as read_ledger).
std::vector<InjectedFailure> read_faults(const std::string& path);
// Appends one injected failure to faults.jsonl as one synced line (several ranks may append at once:
// each line is one O_APPEND write). Throws std::runtime_error when the file cannot be written.
void append_injected_failure(const std::string& path, const InjectedFailure& failure);

// `path` itself when it is a file, else `path`/ledger.jsonl.
std::string ledger_path(const std::string& file_or_directory);

// Unix time in seconds, as recorded in the ledger.
double unix_time_now();

// What a step computed, recorded with its samples: "loss", "num_loss_tokens", "grad_norm", "lr".
struct StepTotals {
  double loss = 0.0;
  int64_t num_loss_tokens = 0;
  double grad_norm = 0.0;
  double lr = 0.0;
};

// Appends events for one attempt. Opening counts the start events already in the file: this attempt
// is that count + 1. Each append is one write of one whole line, followed by fsync.
class LedgerWriter {
 public:
  // Opens (creating it and its directory's entry durably) `path` for appending. A torn last line left
  // by a killed writer is cut off first, so the new lines do not join it. Throws InputError when the
  // file cannot be opened or holds a malformed line.
  explicit LedgerWriter(const std::string& path);
  ~LedgerWriter();
  LedgerWriter(const LedgerWriter&) = delete;
  LedgerWriter& operator=(const LedgerWriter&) = delete;

  int attempt() const { return attempt_; }

  // Before start(), in an attempt that resumes from the verified checkpoint of `step`: when the attempt
  // that committed it was killed between the commit and its checkpoint line (the file has no checkpoint
  // line of `step`, and its last attempt recorded `step` as its last step without ending), appends that
  // line on its behalf, marked as recovered by this attempt. The checkpoint on disk is the truth and the
  // ledger is reconciled from it, visibly; a kill before or after this append leaves a consistent file.
  // Returns whether it appended.
  bool record_recovered_checkpoint(int64_t step, const std::string& checkpoint_path);
  // `data_fingerprint`: the content fingerprint of the data the attempt reads (empty: not recorded).
  void start(const StartInfo& info, const std::string& data_fingerprint = "");
  // `samples_per_dp_rank[r]`: the global sample indices dp rank r consumed in step `step`, in order.
  // `totals`, when given, adds what the step computed (exact doubles), so that two ledgers also show
  // whether two runs computed the same losses.
  void step(int64_t step, const std::vector<std::vector<int64_t>>& samples_per_dp_rank,
            const StepTotals* totals = nullptr);
  // Call after the checkpoint of `step` is committed; `checkpoint_path` as the resume would name it.
  void checkpoint(int64_t step, const std::string& checkpoint_path);
  // A clean end of this attempt after `steps_completed` steps.
  void end(int64_t steps_completed);

 private:
  void append(const std::string& line);

  // What the file held when it was opened, for record_recovered_checkpoint().
  struct History {
    int last_attempt = 0;  // attempt number of the last start event (0: none)
    bool last_attempt_ended = false;
    int64_t last_step = 0;             // the last step event of the last attempt (0: none)
    std::vector<int64_t> checkpoints;  // steps of every checkpoint event
  };

  std::string path_;
  int fd_ = -1;
  int attempt_ = 0;
  History history_;
};

}  // namespace touchstone::ledger
