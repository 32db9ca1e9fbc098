#include "server/reflection.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/support/server_callback.h"

namespace attend::server {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

const DescriptorPool& Pool() { return *DescriptorPool::generated_pool(); }

// A client's name, safe to echo in an error message: escaped and cut at 200 bytes.
std::string Quoted(const std::string& name) {
  std::string quoted = absl::StrCat("'", absl::CHexEscape(name.substr(0, 200)), "'");
  if (name.size() > 200) quoted += "...";
  return quoted;
}

// Appends `file` to `out` as a serialized FileDescriptorProto after the files it imports
// (depth first, post order: a client can then build each file as it reads it), skipping the
// files in `seen`.
void AddFileAfterImports(const FileDescriptor* file, absl::flat_hash_set<std::string>* seen,
                         std::vector<std::string>* out) {
  if (file == nullptr || !seen->insert(file->name()).second) return;
  // nullptr for a weak import that is not linked in; the file is still usable without it.
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileAfterImports(file->dependency(i), seen, out);
  }
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->push_back(proto.SerializeAsString());
}

std::vector<std::string> FileSet(const FileDescriptor* file) {
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> files;
  AddFileAfterImports(file, &seen, &files);
  return files;
}

absl::StatusOr<std::vector<std::string>> FileByName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("file_by_filename is empty");
  const FileDescriptor* file = Pool().FindFileByName(name);
  if (file == nullptr) return absl::NotFoundError(absl::StrCat("file not found: ", Quoted(name)));
  return FileSet(file);
}

absl::StatusOr<std::vector<std::string>> FileContainingSymbol(const std::string& symbol) {
  if (symbol.empty()) return absl::InvalidArgumentError("file_containing_symbol is empty");
  // Services, methods, messages, fields, oneofs, enums, enum values and extensions alike.
  const FileDescriptor* file = Pool().FindFileContainingSymbol(symbol);
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("symbol not found: ", Quoted(symbol)));
  }
  return FileSet(file);
}

const google::protobuf::Descriptor* FindType(const std::string& type, absl::Status* status) {
  if (type.empty()) {
    *status = absl::InvalidArgumentError("the message type name is empty");
    return nullptr;
  }
  const google::protobuf::Descriptor* descriptor = Pool().FindMessageTypeByName(type);
  if (descriptor == nullptr) {
    *status = absl::NotFoundError(absl::StrCat("message type not found: ", Quoted(type)));
  }
  return descriptor;
}

absl::StatusOr<std::vector<std::string>> FileContainingExtension(const std::string& type,
                                                                 int number) {
  absl::Status status;
  const google::protobuf::Descriptor* descriptor = FindType(type, &status);
  if (descriptor == nullptr) return status;
  const google::protobuf::FieldDescriptor* extension =
      Pool().FindExtensionByNumber(descriptor, number);
  if (extension == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("extension ", number, " of ", descriptor->full_name(), " not found"));
  }
  return FileSet(extension->file());
}

absl::StatusOr<std::vector<int>> ExtensionNumbers(const std::string& type, std::string* full_name) {
  absl::Status status;
  const google::protobuf::Descriptor* descriptor = FindType(type, &status);
  if (descriptor == nullptr) return status;
  std::vector<const google::protobuf::FieldDescriptor*> extensions;
  Pool().FindAllExtensions(descriptor, &extensions);
  std::vector<int> numbers;
  numbers.reserve(extensions.size());
  for (const google::protobuf::FieldDescriptor* e : extensions) numbers.push_back(e->number());
  *full_name = descriptor->full_name();
  return numbers;
}

// Longest file or symbol name a request may carry: far above any name in the pool (attend's
// longest is under 100 bytes). protobuf's lookup of a dotted name costs time quadratic in its
// length, and it runs on one of gRPC's callback threads, which also answer health checks: a
// 240 KB "a.a.a..." took 8 s before names were bounded.
constexpr size_t kMaxNameBytes = 1024;

// The name a request asks about (file, symbol or type) and its field; none (empty) for
// list_services and an empty request.
struct RequestedName {
  const char* field = "";
  size_t bytes = 0;
};

template <typename Request>
RequestedName NameOf(const Request& request) {
  switch (request.message_request_case()) {
    case Request::kFileByFilename:
      return {"file_by_filename", request.file_by_filename().size()};
    case Request::kFileContainingSymbol:
      return {"file_containing_symbol", request.file_containing_symbol().size()};
    case Request::kFileContainingExtension:
      return {"file_containing_extension.containing_type",
              request.file_containing_extension().containing_type().size()};
    case Request::kAllExtensionNumbersOfType:
      return {"all_extension_numbers_of_type", request.all_extension_numbers_of_type().size()};
    default:
      return {};
  }
}

// `response` for `request`, one of either version's pair of generated message types (they are
// wire-identical, and so are their generated accessors).
template <typename Request, typename Response>
void Answer(const Request& request, const std::vector<std::string>& service_names,
            Response* response) {
  response->set_valid_host(request.host().substr(0, kMaxNameBytes));
  if (const RequestedName name = NameOf(request); name.bytes > kMaxNameBytes) {
    // Refused before any lookup, and not echoed back.
    response->mutable_error_response()->set_error_code(grpc::StatusCode::INVALID_ARGUMENT);
    response->mutable_error_response()->set_error_message(
        absl::StrCat(name.field, ": ", name.bytes, " bytes, longer than the ", kMaxNameBytes,
                     " of any name this server knows"));
    return;
  }
  absl::StatusOr<std::vector<std::string>> files = std::vector<std::string>();  // none
  absl::Status status;
  switch (request.message_request_case()) {
    case Request::kFileByFilename:
      files = FileByName(request.file_by_filename());
      break;
    case Request::kFileContainingSymbol:
      files = FileContainingSymbol(request.file_containing_symbol());
      break;
    case Request::kFileContainingExtension:
      files = FileContainingExtension(request.file_containing_extension().containing_type(),
                                      request.file_containing_extension().extension_number());
      break;
    case Request::kAllExtensionNumbersOfType: {
      std::string full_name;
      absl::StatusOr<std::vector<int>> numbers =
          ExtensionNumbers(request.all_extension_numbers_of_type(), &full_name);
      status = numbers.status();
      if (numbers.ok()) {
        auto* answer = response->mutable_all_extension_numbers_response();
        answer->set_base_type_name(full_name);
        answer->mutable_extension_number()->Add(numbers->begin(), numbers->end());
      }
      break;
    }
    case Request::kListServices:
      for (const std::string& name : service_names) {
        response->mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case Request::MESSAGE_REQUEST_NOT_SET:
      status = absl::InvalidArgumentError(
          "empty request: set one of file_by_filename, file_containing_symbol, "
          "file_containing_extension, all_extension_numbers_of_type or list_services");
      break;
  }
  if (!files.ok()) {
    status = files.status();
  } else if (!files->empty()) {
    for (std::string& file : *files) {
      response->mutable_file_descriptor_response()->add_file_descriptor_proto(std::move(file));
    }
  }
  if (!status.ok()) {
    // absl and gRPC status codes have the same numbers.
    response->mutable_error_response()->set_error_code(static_cast<int>(status.code()));
    response->mutable_error_response()->set_error_message(std::string(status.message()));
  }
  *response->mutable_original_request() = request;
}

// One stream: read a request, write its response, repeat until the client half-closes. At most
// one operation is outstanding at a time, so the callbacks never run concurrently.
template <typename Request, typename Response>
class ReflectionReactor final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit ReflectionReactor(const std::vector<std::string>* service_names)
      : service_names_(service_names) {
    this->StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    // Not ok: the client half-closed (or the call ended); either way there is nothing to answer.
    if (!ok) {
      this->Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    Answer(request_, *service_names_, &response_);
    this->StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      this->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream is broken"));
      return;
    }
    this->StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const std::vector<std::string>* const service_names_;
  Request request_;
  Response response_;
};

template <typename CallbackService, typename Request, typename Response>
class ReflectionService final : public CallbackService {
 public:
  explicit ReflectionService(const std::vector<std::string>* service_names)
      : service_names_(service_names) {}

  grpc::ServerBidiReactor<Request, Response>* ServerReflectionInfo(
      grpc::CallbackServerContext* /*context*/) override {
    return new ReflectionReactor<Request, Response>(service_names_);
  }

 private:
  const std::vector<std::string>* const service_names_;
};

namespace v1 = grpc::reflection::v1;
namespace v1alpha = grpc::reflection::v1alpha;
using V1Service = ReflectionService<v1::ServerReflection::CallbackService,
                                    v1::ServerReflectionRequest, v1::ServerReflectionResponse>;
using V1AlphaService =
    ReflectionService<v1alpha::ServerReflection::CallbackService, v1alpha::ServerReflectionRequest,
                      v1alpha::ServerReflectionResponse>;

std::vector<std::string> WithReflection(std::vector<std::string> names) {
  names.push_back(kReflectionV1Service);
  names.push_back(kReflectionV1AlphaService);
  return names;
}

}  // namespace

ReflectionServices::ReflectionServices(std::vector<std::string> service_names)
    : service_names_(WithReflection(std::move(service_names))),
      v1_(std::make_unique<V1Service>(&service_names_)),
      v1alpha_(std::make_unique<V1AlphaService>(&service_names_)) {
  // A use of health.pb.cc, so that the linker keeps it (attend::proto is a static library) and
  // its descriptors are registered in the generated pool: libgrpc++'s health service has none.
  grpc::health::v1::HealthCheckRequest::descriptor();
}

ReflectionServices::~ReflectionServices() = default;

}  // namespace attend::server
