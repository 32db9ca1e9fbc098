#include "client/cli/render/terminal_notes.h"

#include <chrono>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/render/format.h"

namespace attend::cli {

std::string FormatProgress(const std::string& what, int64_t done, int64_t total, double rate) {
  return absl::StrCat(what, ": ", Count(done), "/", Count(total),
                      total == 1 ? " request" : " requests",
                      rate < 0 ? "" : absl::StrCat(", ", Rate(rate), " requests/s"));
}

ProgressLine::ProgressLine(std::ostream* err, bool enabled, std::string what, int64_t total,
                           const std::atomic<int64_t>* done, absl::Duration interval)
    : err_(err), what_(std::move(what)), total_(total), done_(done) {
  if (!enabled) {
    stop_ = true;
    return;
  }
  Draw(FormatProgress(what_, done_->load(), total_, -1));
  thread_ = std::thread([this, interval] { Loop(interval); });
}

void ProgressLine::Draw(const std::string& line) {
  // Spaces over what a longer earlier line left; "\r" back to the start for the next draw.
  *err_ << "\r" << line << std::string(drawn_ > line.size() ? drawn_ - line.size() : 0, ' ')
        << std::flush;
  drawn_ = line.size();
}

void ProgressLine::Loop(absl::Duration interval) {
  // (time, done) of about the last second, for the current rate.
  std::deque<std::pair<absl::Time, int64_t>> recent = {{absl::Now(), done_->load()}};
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, absl::ToChronoNanoseconds(interval), [this] { return stop_; })) {
    const absl::Time now = absl::Now();
    const int64_t done = done_->load();
    while (recent.size() > 1 && now - recent[1].first >= absl::Seconds(1)) recent.pop_front();
    const double seconds = absl::ToDoubleSeconds(now - recent.front().first);
    Draw(FormatProgress(
        what_, done, total_,
        seconds > 0 ? static_cast<double>(done - recent.front().second) / seconds : -1));
    recent.emplace_back(now, done);
  }
}

void ProgressLine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  *err_ << "\r" << std::string(drawn_, ' ') << "\r" << std::flush;
}

std::string WorkingText(const std::string& call, const std::string& target) {
  return absl::StrCat("working... (", call, " sent to ", target, "; no reply yet)");
}

WorkingNote::WorkingNote(std::ostream* err, bool enabled, absl::Duration after, std::string text) {
  if (!enabled) return;
  if (after <= absl::ZeroDuration()) {
    *err << text << "\n" << std::flush;
    return;
  }
  thread_ = std::thread([this, err, after, text = std::move(text)] {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(after), [this] { return done_; })) {
      *err << text << "\n" << std::flush;
    }
  });
}

WorkingNote::~WorkingNote() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace attend::cli
