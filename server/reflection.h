// gRPC server reflection: grpc.reflection.v1.ServerReflection and its wire-identical
// predecessor grpc.reflection.v1alpha.ServerReflection, from one implementation.
//
// Why our own: gRPC 1.51's plugin (libgrpc++_reflection) serves only v1alpha, while current
// clients (grpcurl, grpcui, Postman) ask v1 first. Serving v1alpha here too, instead of beside
// that plugin, lets both share one code path and lets attend compile the v1alpha proto itself
// (the plugin's library registers the same symbols, so the two cannot be linked together).
//
// What is described: protobuf's generated descriptor pool, i.e. every .proto compiled into the
// binary. That includes grpc/health/v1/health.proto (linked in by this library), so that
// grpc.health.v1.Health is describable although libgrpc++'s health service has no C++
// descriptor of its own.
//
// Each request on the stream gets one response, in order; errors are answered in an
// error_response and the stream goes on:
//   list_services                 -> the names given to the constructor, then v1 and v1alpha
//   file_by_filename,             -> the file and every file it imports, transitively, as
//   file_containing_symbol,          serialized FileDescriptorProtos: each file once per
//   file_containing_extension        response, dependencies before dependents (the file last)
//   all_extension_numbers_of_type -> the type's full name and its extension numbers
//   unknown file, symbol or type  -> NOT_FOUND
//   no request set, or empty name -> INVALID_ARGUMENT
//   a name over 1024 bytes        -> INVALID_ARGUMENT, before any lookup, without the
//                                    original_request (protobuf's lookup of a long dotted name
//                                    takes quadratic time on a thread health checks share)
// Symbols are fully qualified names of services, methods, messages, enums, enum values, fields
// and extensions, without a leading dot.
//
// Thread-safety: the services are immutable after construction and serve any number of streams
// concurrently (they use gRPC's callback API: no thread is held by an open stream).
#ifndef ATTEND_SERVER_REFLECTION_H_
#define ATTEND_SERVER_REFLECTION_H_

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/impl/service_type.h"

namespace attend::server {

inline constexpr char kReflectionV1Service[] = "grpc.reflection.v1.ServerReflection";
inline constexpr char kReflectionV1AlphaService[] = "grpc.reflection.v1alpha.ServerReflection";

// Both reflection services, to register with one grpc::ServerBuilder. REQUIRES: outlives the
// grpc::Server they are registered with.
class ReflectionServices {
 public:
  // `service_names`: the full names of the other services the server serves (its own, health),
  // which list_services answers, followed by the two reflection services.
  explicit ReflectionServices(std::vector<std::string> service_names);
  ~ReflectionServices();
  ReflectionServices(const ReflectionServices&) = delete;
  ReflectionServices& operator=(const ReflectionServices&) = delete;

  grpc::Service* v1() const { return v1_.get(); }
  grpc::Service* v1alpha() const { return v1alpha_.get(); }

 private:
  const std::vector<std::string> service_names_;  // used by both services
  std::unique_ptr<grpc::Service> v1_;
  std::unique_ptr<grpc::Service> v1alpha_;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_REFLECTION_H_
