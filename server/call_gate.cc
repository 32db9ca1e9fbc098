#include "server/call_gate.h"

#include "absl/strings/match.h"

namespace attend::server {

// Admits an attend.v1 call when gRPC creates it (the call's start) and lets it go when gRPC
// destroys it (after its status was sent and its reactor is done).
class CallGate::Interceptor : public grpc::experimental::Interceptor {
 public:
  Interceptor(CallGate* gate, grpc::experimental::ServerRpcInfo* info)
      : gate_(gate), context_(info->server_context()) {
    admitted_ = absl::StartsWith(info->method(), "/attend.v1.") && gate_->Enter(context_);
  }
  ~Interceptor() override {
    if (admitted_) gate_->Leave(context_);
  }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  CallGate* const gate_;
  const grpc::ServerContextBase* const context_;
  bool admitted_ = false;
};

namespace {

class Factory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(
      std::function<grpc::experimental::Interceptor*(grpc::experimental::ServerRpcInfo*)> create)
      : create_(std::move(create)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return create_(info);
  }

 private:
  std::function<grpc::experimental::Interceptor*(grpc::experimental::ServerRpcInfo*)> create_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallGate::NewInterceptorFactory() {
  return std::make_unique<Factory>(
      [this](grpc::experimental::ServerRpcInfo* info) { return new Interceptor(this, info); });
}

bool CallGate::Enter(const grpc::ServerContextBase* context) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return false;
  calls_.insert(context);
  return true;
}

void CallGate::Leave(const grpc::ServerContextBase* context) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(context);
  if (calls_.empty()) idle_.notify_all();
}

bool CallGate::Admitted(const grpc::ServerContextBase* context) const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_.contains(context);
}

void CallGate::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool CallGate::WaitIdle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_until(lock, deadline, [this] { return calls_.empty(); });
}

int64_t CallGate::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(calls_.size());
}

}  // namespace attend::server
