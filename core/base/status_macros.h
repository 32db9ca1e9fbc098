// Small Status helpers that abseil 20220623 does not ship.
#ifndef ATTEND_CORE_BASE_STATUS_MACROS_H_
#define ATTEND_CORE_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function when it is not OK.
#define ATTEND_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status attend_status_ = (expr);          \
    if (!attend_status_.ok()) return attend_status_; \
  } while (false)

#define ATTEND_STATUS_CONCAT_INNER_(a, b) a##b
#define ATTEND_STATUS_CONCAT_(a, b) ATTEND_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status when not OK, otherwise moves the
// value into `lhs` (a declaration such as `auto x` or an existing variable).
#define ATTEND_ASSIGN_OR_RETURN(lhs, rexpr) \
  ATTEND_ASSIGN_OR_RETURN_IMPL_(ATTEND_STATUS_CONCAT_(attend_statusor_, __LINE__), lhs, rexpr)

#define ATTEND_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // ATTEND_CORE_BASE_STATUS_MACROS_H_
