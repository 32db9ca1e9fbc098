// What the CLI tells a person watching a terminal while it waits: a live progress line of a
// benchmark, and a one-line "working..." note when a call takes long. Both are drawn on the
// error stream, and only when it is a terminal (Context::err_is_terminal): piped or redirected
// output gets nothing extra, so scripts see the same bytes either way.
//
// Thread-safety: FormatProgress is a pure function. A ProgressLine or WorkingNote owns a thread
// that writes to the stream it was given; until it is destroyed (or Stop()ped) nothing else may
// write to that stream. Its methods are called from the thread that made it.
#ifndef ATTEND_CLIENT_CLI_RENDER_TERMINAL_NOTES_H_
#define ATTEND_CLIENT_CLI_RENDER_TERMINAL_NOTES_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace attend::cli {

// "bench Attend: 1,234/5,000 requests, 812 requests/s"; the rate is left out while it is not
// known (negative).
std::string FormatProgress(const std::string& what, int64_t done, int64_t total, double rate);

// A progress line of `what` redrawn in place ("\r") every `interval` while *done counts
// towards `total`, the rate measured over about the last second. Drawn at once when made and
// cleared (overwritten with spaces) when stopped; nothing at all unless `enabled`.
// REQUIRES: *done outlives the line.
class ProgressLine {
 public:
  ProgressLine(std::ostream* err, bool enabled, std::string what, int64_t total,
               const std::atomic<int64_t>* done, absl::Duration interval = absl::Milliseconds(250));
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine() { Stop(); }

  // Stops redrawing and clears the line. Idempotent.
  void Stop();

 private:
  void Draw(const std::string& line);
  void Loop(absl::Duration interval);

  std::ostream* const err_;
  const std::string what_;
  const int64_t total_;
  const std::atomic<int64_t>* const done_;
  size_t drawn_ = 0;  // length of the line on the terminal, to clear it
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

// "working... (Append of 65,536 tokens sent to localhost:50051; no reply yet)": the text of the
// WorkingNote of `call`.
std::string WorkingText(const std::string& call, const std::string& target);

// `text` and a newline on *err when `after` passes before the note is destroyed, i.e. before
// the reply that the caller waits for came; at once when `after` is not positive. Nothing
// unless `enabled`.
class WorkingNote {
 public:
  WorkingNote(std::ostream* err, bool enabled, absl::Duration after, std::string text);
  WorkingNote(const WorkingNote&) = delete;
  WorkingNote& operator=(const WorkingNote&) = delete;
  ~WorkingNote();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_RENDER_TERMINAL_NOTES_H_
