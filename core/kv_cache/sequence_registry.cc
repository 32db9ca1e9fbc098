#include "core/kv_cache/sequence_registry.h"

#include <algorithm>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sequence_key.h"
#include "core/base/status_macros.h"

namespace attend::kv {
namespace {

constexpr size_t kMaxIdBytes = kMaxSequenceIdBytes;
constexpr size_t kRememberedGone = 10000;

}  // namespace

absl::Status CheckSequenceId(absl::string_view id, absl::string_view field) {
  switch (CheckSequenceIdSyntax(id)) {
    case SequenceIdProblem::kNone:
      return absl::OkStatus();
    case SequenceIdProblem::kLength:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": length ", id.size(), "; ids have 1 to ", kMaxIdBytes, " bytes"));
    case SequenceIdProblem::kCharacter:
      return absl::InvalidArgumentError(absl::StrCat(field, ": '",
                                                     absl::CHexEscape(id.substr(0, 64)),
                                                     "' has a character outside [A-Za-z0-9._:/-]"));
    case SequenceIdProblem::kPart:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", id.substr(0, 64),
                       "' has an empty, '.' or '..' part between '/'s; the "
                       "part before the first '/' is the id's routing key"));
  }
  return absl::OkStatus();
}

absl::Status CheckGeneratedKey(absl::string_view key, absl::string_view field) {
  // "/" and 16 hex digits follow the key.
  constexpr size_t kLongestKey = kMaxIdBytes - 17;
  ATTEND_RETURN_IF_ERROR(CheckSequenceId(key, field));
  if (key.find(kRoutingKeySeparator) != absl::string_view::npos || key.size() > kLongestKey) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", QuotedId(key), " cannot start a generated id ('<key>/' and 16 hex digits): ",
        "a key has no '/' and at most ", kLongestKey, " bytes; give the id instead"));
  }
  return absl::OkStatus();
}

std::string QuotedId(absl::string_view id) {
  if (CheckSequenceId(id, "").ok()) return absl::StrCat("'", id, "'");
  constexpr size_t kShown = 64;
  if (id.size() <= kShown) return absl::StrCat("'", absl::CHexEscape(id), "'");
  return absl::StrCat("'", absl::CHexEscape(id.substr(0, kShown)), "...' (", id.size(), " bytes)");
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"};
  if (bytes < 1024) return absl::StrCat(static_cast<int64_t>(bytes), " bytes");
  int unit = 0;
  bytes /= 1024;
  while (bytes >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", bytes, kUnits[unit]);
}

SequenceRegistry::Lease::Lease(SequenceRegistry* registry, std::shared_ptr<Sequence> sequence)
    : registry_(registry), sequence_(std::move(sequence)) {}

SequenceRegistry::Lease::Lease(Lease&& other) noexcept
    : registry_(other.registry_), sequence_(std::move(other.sequence_)) {}

SequenceRegistry::Lease::~Lease() {
  if (sequence_) registry_->Done(sequence_.get());
}

SequenceRegistry::SequenceRegistry(int64_t max_sequences, int64_t max_bookkeeping_bytes,
                                   Clock clock)
    : max_sequences_(max_sequences),
      max_bookkeeping_bytes_(max_bookkeeping_bytes),
      clock_(std::move(clock)) {}

SequenceRegistry::~SequenceRegistry() {
  MutexLock lock(&mu_);
  sequences_.clear();
}

absl::StatusOr<SequenceRegistry::Lease> SequenceRegistry::Acquire(absl::string_view id) {
  MutexLock lock(&mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return NotFoundLocked(id);
  it->second->in_use.fetch_add(1);
  it->second->last_used_ms = clock_();
  return Lease(this, it->second);
}

void SequenceRegistry::Done(Sequence* sequence) {
  sequence->last_used_ms = clock_();
  sequence->in_use.fetch_sub(1);
}

absl::StatusOr<std::shared_ptr<Sequence>> SequenceRegistry::Find(absl::string_view id) {
  MutexLock lock(&mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return NotFoundLocked(id);
  return it->second;
}

std::vector<std::shared_ptr<Sequence>> SequenceRegistry::Page(int64_t count,
                                                              absl::string_view after, bool* more) {
  std::vector<std::shared_ptr<Sequence>> page;
  MutexLock lock(&mu_);
  auto it = after.empty() ? sequences_.begin() : sequences_.upper_bound(after);
  for (; it != sequences_.end() && static_cast<int64_t>(page.size()) < count; ++it) {
    page.push_back(it->second);
  }
  *more = it != sequences_.end();
  return page;
}

std::vector<std::shared_ptr<Sequence>> SequenceRegistry::All() {
  std::vector<std::shared_ptr<Sequence>> all;
  MutexLock lock(&mu_);
  for (const auto& [id, sequence] : sequences_) all.push_back(sequence);
  return all;
}

absl::Status SequenceRegistry::CheckRoomLocked(absl::string_view id, int64_t bookkeeping_bytes,
                                               absl::string_view what) {
  if (!id.empty() && sequences_.count(id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", QuotedId(id), " already exists"));
  }
  if (static_cast<int64_t>(sequences_.size()) >= max_sequences_) {
    return absl::ResourceExhaustedError(absl::StrCat("the cache holds ", sequences_.size(),
                                                     " sequences, its limit (--max_sequences)"));
  }
  if (bookkeeping_bytes > max_bookkeeping_bytes_ - bookkeeping_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", FormatBytes(static_cast<double>(bookkeeping_bytes)),
                     " of bookkeeping (its layers' block tables); the cache's ", sequences_.size(),
                     " sequences hold ", FormatBytes(static_cast<double>(bookkeeping_bytes_)),
                     " of the ", FormatBytes(static_cast<double>(max_bookkeeping_bytes_)),
                     " bookkeeping limit (--kv_bookkeeping_bytes)"));
  }
  return absl::OkStatus();
}

absl::Status SequenceRegistry::CheckRoom(absl::string_view id, int64_t bookkeeping_bytes,
                                         absl::string_view what) {
  MutexLock lock(&mu_);
  return CheckRoomLocked(id, bookkeeping_bytes, what);
}

absl::Status SequenceRegistry::Publish(const std::shared_ptr<Sequence>& sequence,
                                       absl::string_view id, absl::string_view what,
                                       absl::string_view generated_key) {
  MutexLock lock(&mu_);
  if (absl::Status room = CheckRoomLocked(id, sequence->bookkeeping_bytes, what); !room.ok()) {
    return room;
  }
  sequence->id = id.empty() ? NewId(generated_key) : std::string(id);
  gone_.erase(sequence->id);
  sequences_.emplace(sequence->id, sequence);
  bookkeeping_bytes_ += sequence->bookkeeping_bytes;
  return absl::OkStatus();
}

std::shared_ptr<Sequence> SequenceRegistry::EraseLocked(
    std::map<std::string, std::shared_ptr<Sequence>, std::less<>>::iterator it) {
  std::shared_ptr<Sequence> sequence = std::move(it->second);
  sequences_.erase(it);
  bookkeeping_bytes_ -= sequence->bookkeeping_bytes;
  return sequence;
}

void SequenceRegistry::AddBookkeeping(Sequence& sequence, int64_t delta) {
  if (delta == 0) return;
  MutexLock lock(&mu_);
  sequence.bookkeeping_bytes += delta;
  auto it = sequences_.find(sequence.id);
  if (it != sequences_.end() && it->second.get() == &sequence) bookkeeping_bytes_ += delta;
}

int64_t SequenceRegistry::bookkeeping_bytes() const {
  MutexLock lock(&mu_);
  return bookkeeping_bytes_;
}

std::string SequenceRegistry::NewId(absl::string_view key) {
  static thread_local std::mt19937_64 random(std::random_device{}());
  while (true) {
    const uint64_t bits = random() ^ (++id_counter_);
    std::string id = key.empty() ? absl::StrFormat("seq-%016x", bits)
                                 : absl::StrFormat("%s%c%016x", key, kRoutingKeySeparator, bits);
    if (sequences_.count(id) == 0) return id;
  }
}

void SequenceRegistry::Remove(const Sequence& sequence, const std::string& reason) {
  MutexLock lock(&mu_);
  if (auto it = sequences_.find(sequence.id); it != sequences_.end()) EraseLocked(it);
  Forget(sequence.id, reason);
}

void SequenceRegistry::Forget(const std::string& id, const std::string& reason) {
  if (gone_.insert_or_assign(id, reason).second) gone_order_.push_back(id);
  if (gone_order_.size() > kRememberedGone) {
    gone_.erase(gone_order_.front());
    gone_order_.pop_front();
  }
}

absl::Status SequenceRegistry::NotFound(absl::string_view id) {
  MutexLock lock(&mu_);
  return NotFoundLocked(id);
}

absl::Status SequenceRegistry::NotFoundLocked(absl::string_view id) {
  auto it = gone_.find(std::string(id));
  if (it != gone_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", QuotedId(id), " ", it->second));
  }
  return absl::NotFoundError(absl::StrCat("no sequence ", QuotedId(id)));
}

namespace {

// Idle sequences considered for eviction, with the blocks each holds.
struct Candidate {
  Sequence* sequence;
  std::vector<const Block*> blocks;
};

// Blocks evicting `chosen` makes available to a request: those no one else holds (they go back
// to the pool), plus those among `copies` (shared blocks the request would copy before writing)
// that only the request would still hold, since it then writes into them in place. `use_counts`
// holds every block's references as seen when it was first met.
int64_t Gain(const std::vector<const Candidate*>& chosen,
             const absl::flat_hash_map<const Block*, long>& use_counts,
             absl::Span<const Block* const> copies) {
  absl::flat_hash_map<const Block*, long> left = use_counts;
  for (const Candidate* c : chosen) {
    for (const Block* block : c->blocks) --left[block];
  }
  int64_t gain = 0;
  for (const auto& [block, refs] : left) gain += refs == 0;
  for (const Block* block : copies) {
    auto it = left.find(block);
    gain += it != left.end() && it->second == 1;
  }
  return gain;
}

}  // namespace

std::vector<std::shared_ptr<Sequence>> SequenceRegistry::EvictLruFor(
    int64_t count, const BlockPool& pool, absl::Span<const Block* const> copies) {
  MutexLock lock(&mu_);
  std::vector<Sequence*> idle;
  for (const auto& [id, sequence] : sequences_) {
    if (sequence->in_use.load() == 0) idle.push_back(sequence.get());
  }
  std::stable_sort(idle.begin(), idle.end(), [](const Sequence* a, const Sequence* b) {
    return a->last_used_ms.load() < b->last_used_ms.load();
  });
  // Least recently used first, take candidates until evicting them would make room (a block
  // shared with a sequence that stays does not count), then give back the most recently used
  // ones that are not needed for it, such as a source whose every block a fork in use still
  // holds. Idle sequences' locks are free but for a moment (Get, List); one that cannot be
  // locked now is not a candidate. Locking a sequence after the registry is against the lock
  // order, which a try-lock cannot deadlock.
  const int64_t free = pool.free_blocks();
  std::vector<Candidate> candidates;
  candidates.reserve(idle.size());
  absl::flat_hash_map<const Block*, long> use_counts;
  std::vector<const Candidate*> chosen;
  bool enough = free >= count;
  for (Sequence* sequence : idle) {
    if (enough) break;
    if (!sequence->mu.TryLock()) continue;
    Candidate c{sequence, {}};
    for (const CachedLayer& layer : sequence->layers) {
      for (const BlockRef& block : layer.blocks) {
        if (!block) continue;
        c.blocks.push_back(block.get());
        use_counts.try_emplace(block.get(), block.use_count());
      }
    }
    sequence->mu.Unlock();
    candidates.push_back(std::move(c));
    chosen.push_back(&candidates.back());
    enough = free + Gain(chosen, use_counts, copies) >= count;
  }
  std::vector<std::shared_ptr<Sequence>> evicted;
  if (!enough) return evicted;  // evicting cannot make it fit: evict nothing
  for (size_t i = chosen.size(); i-- > 0;) {
    std::vector<const Candidate*> without = chosen;
    without.erase(without.begin() + static_cast<std::ptrdiff_t>(i));
    if (free + Gain(without, use_counts, copies) >= count) chosen = std::move(without);
  }
  for (const Candidate* c : chosen) {
    evicted.push_back(EraseLocked(sequences_.find(c->sequence->id)));
    Forget(c->sequence->id,
           absl::StrCat("was evicted (least recently used, last used at ",
                        c->sequence->last_used_ms.load(), " ms) to make room for another request"));
    evictions_++;
  }
  return evicted;
}

int64_t SequenceRegistry::EvictableBlocks() {
  MutexLock lock(&mu_);
  std::vector<Candidate> candidates;
  absl::flat_hash_map<const Block*, long> use_counts;
  for (const auto& [id, sequence] : sequences_) {
    if (sequence->in_use.load() != 0 || !sequence->mu.TryLock()) continue;
    Candidate c{sequence.get(), {}};
    for (const CachedLayer& layer : sequence->layers) {
      for (const BlockRef& block : layer.blocks) {
        if (!block) continue;
        c.blocks.push_back(block.get());
        use_counts.try_emplace(block.get(), block.use_count());
      }
    }
    sequence->mu.Unlock();
    candidates.push_back(std::move(c));
  }
  std::vector<const Candidate*> all;
  for (const Candidate& c : candidates) all.push_back(&c);
  return Gain(all, use_counts, {});
}

std::vector<std::shared_ptr<Sequence>> SequenceRegistry::EvictIdle(int64_t ttl_ms) {
  std::vector<std::shared_ptr<Sequence>> expired;
  MutexLock lock(&mu_);
  const int64_t now = clock_();
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    const int64_t idle = now - it->second->last_used_ms.load();
    if (it->second->in_use.load() == 0 && idle > ttl_ms) {
      Forget(it->first, absl::StrCat("was evicted after ", idle / 1000.0, " s idle (TTL ",
                                     ttl_ms / 1000.0, " s)"));
      evictions_++;
      expired.push_back(EraseLocked(it++));
    } else {
      ++it;
    }
  }
  return expired;
}

int64_t SequenceRegistry::size() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(sequences_.size());
}

int64_t SequenceRegistry::tokens() const {
  int64_t tokens = 0;
  MutexLock lock(&mu_);
  for (const auto& [id, sequence] : sequences_) tokens += sequence->total_tokens.load();
  return tokens;
}

}  // namespace attend::kv
