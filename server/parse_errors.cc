#include "server/parse_errors.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"

namespace attend::server {
namespace {

// The request type of "/package.Service/Method", or "" when the method is not known.
std::string RequestType(absl::string_view method) {
  if (!absl::StartsWith(method, "/")) return "";
  const std::string dotted = absl::StrReplaceAll(method.substr(1), {{"/", "."}});
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(dotted);
  return descriptor == nullptr ? "" : descriptor->input_type()->full_name();
}

// Notes whether the unary request arrived but did not parse (gRPC then hands the interceptor
// no message), and if so rewrites the status gRPC sends for it.
class ParseErrorInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(grpc::experimental::ServerRpcInfo* info)
      : info_(info),
        watch_(info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY &&
               absl::StartsWith(info->method(), "/attend.v1.")) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (watch_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      unparsed_ = methods->GetRecvMessage() == nullptr;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::string type = RequestType(info_->method());
      methods->ModifySendStatus(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       CouldNotParse("the request", type.empty() ? "the request type" : type)));
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  const bool watch_;
  bool unparsed_ = false;
};

class Factory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info);
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewParseErrorInterceptorFactory() {
  return std::make_unique<Factory>();
}

std::string CouldNotParse(absl::string_view where, absl::string_view message_type) {
  return absl::StrCat("could not parse ", where, ": its bytes are not a valid ", message_type,
                      " (protobuf wire format, with UTF-8 text in string fields)");
}

}  // namespace attend::server
