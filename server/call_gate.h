// The gate attend's calls pass: a call of an attend.v1 service is admitted when it starts
// (unless the server is draining) and counted until it ends, so that shutdown can wait for
// exactly the calls that started before it, and refuse the others.
//
// Why not gRPC's own shutdown for this: grpc::Server::Shutdown stops accepting every call at
// once, health checks included, so a load balancer probing health during the drain would see
// the port refuse instead of NOT_SERVING. The gate refuses only attend's services and keeps the
// server (and health) answering until the drain is over.
//
// Why an interceptor: it sees a call from its first byte, while a handler runs only once the
// whole request has arrived. A call still receiving a large request when SIGTERM comes is in
// flight and is waited for.
//
// Thread-safety: all methods are thread-safe.
#ifndef ATTEND_SERVER_CALL_GATE_H_
#define ATTEND_SERVER_CALL_GATE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_set.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"

namespace attend::server {

class CallGate {
 public:
  // The interceptor that admits and counts calls; the server installs it. REQUIRES: the gate
  // outlives the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // Whether the call of `context` was admitted (an attend.v1 call that started before the
  // drain). Handlers refuse calls that were not (see ShuttingDown()).
  bool Admitted(const grpc::ServerContextBase* context) const;
  // From now on calls that start are not admitted.
  void Drain();
  // Waits until no admitted call is in flight (true) or `deadline` passes (false).
  bool WaitIdle(std::chrono::steady_clock::time_point deadline);
  int64_t in_flight() const;

 private:
  class Interceptor;
  bool Enter(const grpc::ServerContextBase* context);
  void Leave(const grpc::ServerContextBase* context);

  mutable std::mutex mu_;
  std::condition_variable idle_;
  bool draining_ = false;                                      // guarded by mu_
  absl::flat_hash_set<const grpc::ServerContextBase*> calls_;  // guarded by mu_
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_CALL_GATE_H_
