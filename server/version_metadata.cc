#include "server/version_metadata.h"

#include <string>

#include "common/version/version.h"

namespace attend::server {
namespace {

// The entry's value, made once: it is the same for every call of the process.
const std::string& VersionValue() {
  static const std::string* const value = new std::string(VersionLine("attend-server"));
  return *value;
}

class VersionMetadataInterceptor : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kServerVersionMetadata, VersionValue());
    }
    methods->Proceed();
  }
};

class Factory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* /*info*/) override {
    return new VersionMetadataInterceptor();
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewVersionMetadataInterceptorFactory() {
  return std::make_unique<Factory>();
}

}  // namespace attend::server
