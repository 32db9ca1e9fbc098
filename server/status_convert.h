// absl::Status <-> grpc::Status. The canonical code numbers are the same in both.
#ifndef ATTEND_SERVER_STATUS_CONVERT_H_
#define ATTEND_SERVER_STATUS_CONVERT_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace attend::server {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace attend::server

#endif  // ATTEND_SERVER_STATUS_CONVERT_H_
