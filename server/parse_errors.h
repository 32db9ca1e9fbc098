// Requests whose bytes do not parse as the method's request message.
//
// gRPC's callback API answers a unary request it cannot deserialize with UNIMPLEMENTED and an
// empty message, as if the method did not exist, while the same bytes sent to a synchronous
// service (the health service) get INVALID_ARGUMENT. The interceptor here gives attend's unary
// methods the answer a client can act on: INVALID_ARGUMENT "could not parse the request ...",
// naming the message type. (DecodeStream parses its messages itself; see kv_cache_service.h.)
//
// Thread-safety: the factory and its interceptors may be used from any thread.
#ifndef ATTEND_SERVER_PARSE_ERRORS_H_
#define ATTEND_SERVER_PARSE_ERRORS_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/support/server_interceptor.h"

namespace attend::server {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewParseErrorInterceptorFactory();

// The message for bytes that do not parse as `message_type` (a full protobuf name); `where`
// says which message it was ("the request", "stream message 3").
std::string CouldNotParse(absl::string_view where, absl::string_view message_type);

}  // namespace attend::server

#endif  // ATTEND_SERVER_PARSE_ERRORS_H_
