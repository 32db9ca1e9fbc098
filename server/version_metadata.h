// The server's version on every response, as gRPC initial metadata:
//
//   attend-server-version: attend-server 0.1.0 (commit 5b79571abc12, Release build)
//
// (kServerVersionMetadata, the same text `attend-server --version` prints), so that a client can
// learn which build answered without an RPC of its own: `attend version` reads it from a
// Health/Check. Initial metadata rather than a field, because no response message has room
// for it and every service, libgrpc++'s health service included, sends initial metadata.
//
// Thread-safety: the factory and its interceptors may be used from any thread.
#ifndef ATTEND_SERVER_VERSION_METADATA_H_
#define ATTEND_SERVER_VERSION_METADATA_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"

namespace attend::server {

// An interceptor factory whose interceptors add the version entry to the initial metadata of
// each call (unary and streaming, errors included: gRPC sends initial metadata before the
// status of a call that sent none).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewVersionMetadataInterceptorFactory();

}  // namespace attend::server

#endif  // ATTEND_SERVER_VERSION_METADATA_H_
