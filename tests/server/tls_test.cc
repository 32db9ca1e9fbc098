// TLS, mutual TLS and bearer tokens, end to end over loopback: a throwaway CA, server and client
// certificates made at test time with the openssl command, one server with TLS and one with
// mutual TLS and a token, reached through the client library and the attend CLI.
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attention_client.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "client/connection.h"
#include "client/kv_cache_client.h"
#include "client/planner_client.h"
#include "server/auth.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "s3cret-Token_1";
constexpr char kRotatedToken[] = "next-token-2";

// Makes, in `dir`: ca.pem/ca.key (a CA), server.pem/server.key (signed by it, for the name
// "localhost" only, so that dialling 127.0.0.1 needs --tls_server_name), client.pem/client.key
// (signed by it), other_ca.pem (a CA that signed nothing here), and `tokens` (two tokens, a
// comment and blank lines). Returns the shell's output when a command failed, else "".
std::string MakeCredentials(const std::string& dir) {
  const std::string script = absl::StrCat(
      "set -e; cd '", dir, "'\n",
      "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\"; }\n",
      "key ca.key; key other_ca.key; key server.key; key client.key\n",
      "openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj '/CN=attend test CA'\n",
      "openssl req -x509 -new -key other_ca.key -out other_ca.pem -days 2 -subj '/CN=other CA'\n",
      "openssl req -new -key server.key -out server.csr -subj '/CN=localhost'\n",
      "printf 'subjectAltName=DNS:localhost\\n' > server.ext\n",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile server.ext -out server.pem\n",
      "openssl req -new -key client.key -out client.csr -subj '/CN=attend test client'\n",
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile client.ext -out client.pem\n",
      "printf '# accepted tokens\\n%s\\n\\n  %s  \\n' '", kToken, "' '", kRotatedToken,
      "' > tokens\n", "printf '%s\\n' '", kToken, "' > client_token\n");
  const std::string path = dir + "/make.sh";
  std::ofstream(path) << script;
  FILE* pipe = popen(absl::StrCat("bash '", path, "' 2>&1").c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  return pclose(pipe) == 0 ? "" : absl::StrCat("openssl failed:\n", out);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = ::testing::TempDir() + "/attend_tls_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    const std::string problem = MakeCredentials(*dir_);
    ASSERT_EQ(problem, "") << "the openssl command is needed (scripts/setup.sh installs it)";

    server::ServerOptions tls = ::attend::testing::SmallServerOptions();
    absl::StatusOr<server::TlsServerOptions> files =
        server::LoadTlsFiles(File("server.pem"), File("server.key"), "");
    ASSERT_OK(files);
    tls.tls = *files;
    auto started = server::AttendServer::Start(tls);
    ASSERT_OK(started);
    tls_server_ = started->release();

    server::ServerOptions mutual = ::attend::testing::SmallServerOptions();
    files = server::LoadTlsFiles(File("server.pem"), File("server.key"), File("ca.pem"));
    ASSERT_OK(files);
    mutual.tls = *files;
    absl::StatusOr<std::vector<std::string>> tokens =
        server::ParseTokenFile(ReadFile(File("tokens")));
    ASSERT_OK(tokens);
    mutual.auth_tokens = *tokens;
    mutual.metrics_address = "127.0.0.1:0";  // refused calls are counted there
    started = server::AttendServer::Start(mutual);
    ASSERT_OK(started);
    mutual_server_ = started->release();
  }
  static void TearDownTestSuite() {
    delete tls_server_;
    delete mutual_server_;
    delete dir_;
  }

  static std::string File(const std::string& name) { return *dir_ + "/" + name; }
  static std::string Localhost(const server::AttendServer* s) {
    return absl::StrCat("localhost:", s->port());
  }

  int Run(std::vector<std::string> tokens) {
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }
  // The flags of a client that mutual TLS accepts.
  std::vector<std::string> MutualFlags() {
    return {"--target",
            Localhost(mutual_server_),
            "--tls",
            "--ca_cert",
            File("ca.pem"),
            "--client_cert",
            File("client.pem"),
            "--client_key",
            File("client.key")};
  }
  static client::ConnectionOptions MutualOptions() {
    client::ConnectionOptions o;
    o.target = Localhost(mutual_server_);
    o.deadline = absl::Seconds(10);
    o.tls.enabled = true;
    o.tls.ca_cert_pem = ReadFile(File("ca.pem"));
    o.tls.client_cert_pem = ReadFile(File("client.pem"));
    o.tls.client_key_pem = ReadFile(File("client.key"));
    return o;
  }

  inline static std::string* dir_ = nullptr;
  inline static server::AttendServer* tls_server_ = nullptr;
  inline static server::AttendServer* mutual_server_ = nullptr;
  std::ostringstream out_, err_;
};

TEST_F(TlsTest, ClientWithTheCaConnects) {
  client::ConnectionOptions o;
  o.target = Localhost(tls_server_);
  o.tls.enabled = true;
  o.tls.ca_cert_pem = ReadFile(File("ca.pem"));
  ASSERT_OK(client::ValidateConnectionOptions(o));
  const client::AttentionClient attention(client::Connect(o), o);
  absl::StatusOr<v1::SoftmaxResponse> r = attention.Softmax({2, 1, 0.5}, false);
  ASSERT_OK(r);
  EXPECT_NEAR(r->probabilities(0), 0.6285, 1e-4);

  EXPECT_EQ(Run({"--target", Localhost(tls_server_), "--tls", "--ca_cert", File("ca.pem"),
                 "softmax", "2", "1", "0.5"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("0.628532"));
}

TEST_F(TlsTest, ClientWithoutTheCaFailsWithAClearError) {
  // The system's roots do not know the throwaway CA, and neither does another CA.
  EXPECT_EQ(Run({"--target", Localhost(tls_server_), "--tls", "--deadline", "5", "health"}),
            cli::kExitConnection);
  EXPECT_THAT(err_.str(), HasSubstr("certificate verify failed"));
  EXPECT_THAT(err_.str(), HasSubstr("hint: the server's certificate is not signed by a CA this "
                                    "client trusts: give that CA with --ca_cert"));
  EXPECT_EQ(Run({"--target", Localhost(tls_server_), "--tls", "--ca_cert", File("other_ca.pem"),
                 "--deadline", "5", "health"}),
            cli::kExitConnection);
  EXPECT_THAT(err_.str(), HasSubstr("certificate verify failed"));
}

TEST_F(TlsTest, PlaintextClientIsToldToUseTls) {
  EXPECT_EQ(Run({"--target", Localhost(tls_server_), "--deadline", "5", "health"}),
            cli::kExitConnection);
  EXPECT_THAT(err_.str(), HasSubstr("error: UNAVAILABLE"));
  EXPECT_THAT(err_.str(), HasSubstr("or it speaks TLS (then add --tls, and --ca_cert)"));
}

TEST_F(TlsTest, TlsClientToAPlaintextServerIsToldToDropTls) {
  auto plain = server::AttendServer::Start(::attend::testing::SmallServerOptions());
  ASSERT_OK(plain);
  EXPECT_EQ(Run({"--target", absl::StrCat("127.0.0.1:", (*plain)->port()), "--tls", "--deadline",
                 "5", "health"}),
            cli::kExitConnection);
  EXPECT_THAT(err_.str(), HasSubstr("the server does not speak TLS: drop --tls"));
}

TEST_F(TlsTest, ServerNameOverrideChecksTheCertificateName) {
  // The certificate names localhost, not 127.0.0.1.
  const std::string ip = absl::StrCat("127.0.0.1:", tls_server_->port());
  EXPECT_EQ(
      Run({"--target", ip, "--tls", "--ca_cert", File("ca.pem"), "--deadline", "5", "health"}),
      cli::kExitConnection);
  EXPECT_THAT(err_.str(), HasSubstr("--tls_server_name"));
  EXPECT_EQ(Run({"--target", ip, "--tls", "--ca_cert", File("ca.pem"), "--tls_server_name",
                 "localhost", "health"}),
            cli::kExitOk)
      << err_.str();
}

TEST_F(TlsTest, MutualTlsRefusesAClientWithoutACertificate) {
  EXPECT_EQ(Run({"--target", Localhost(mutual_server_), "--tls", "--ca_cert", File("ca.pem"),
                 "--token_file", File("client_token"), "--deadline", "5", "softmax", "1"}),
            cli::kExitConnection);
  EXPECT_THAT(err_.str(), HasSubstr("--client_cert and --client_key"));
  // A certificate its CA did not sign is refused as well: the server's own serves as one.
  client::ConnectionOptions o = MutualOptions();
  o.tls.client_cert_pem = ReadFile(File("other_ca.pem"));
  o.tls.client_key_pem = ReadFile(File("other_ca.key"));
  o.bearer_token = kToken;
  EXPECT_THAT(client::CheckHealth(client::Connect(o), "", absl::Seconds(5)),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, MissingOrWrongTokenIsUnauthenticatedWhileHealthStaysOpen) {
  std::vector<std::string> flags = MutualFlags();
  // No token: health answers (probes need no secret), everything else is refused.
  std::vector<std::string> health = flags;
  health.push_back("health");
  EXPECT_EQ(Run(health), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("attend.v1.KvCache    SERVING"));
  std::vector<std::string> softmax = flags;
  softmax.insert(softmax.end(), {"softmax", "2", "1", "0.5"});
  EXPECT_EQ(Run(softmax), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: UNAUTHENTICATED: this server needs a bearer token"));
  EXPECT_THAT(err_.str(), HasSubstr("hint: the server wants a bearer token: --token_file"));
  // A wrong token, also one of the right length.
  for (const std::string& wrong : {std::string("nope"), std::string(kToken).replace(0, 1, "S")}) {
    std::vector<std::string> tokens = flags;
    tokens.insert(tokens.end(), {"--token", wrong, "seq", "stats"});
    EXPECT_EQ(Run(tokens), cli::kExitServerError) << wrong;
    EXPECT_THAT(err_.str(), HasSubstr("UNAUTHENTICATED: the bearer token is not accepted"));
    EXPECT_THAT(err_.str(), Not(HasSubstr(wrong)));  // never echoed
  }
  // Reflection is not health: it needs the token too.
  client::ConnectionOptions o = MutualOptions();
  EXPECT_THAT(client::PlannerClient(client::Connect(o), o).ListModels(),
              StatusIs(absl::StatusCode::kUnauthenticated));
  // Refused calls never reach a service, but operators see them, by reason.
  const std::string metrics = ::attend::testing::ScrapeMetrics(mutual_server_->metrics_port());
  EXPECT_GE(::attend::testing::MetricValue(metrics, "attend_auth_rejections_total",
                                           {"reason=\"missing_token\""}),
            2);
  EXPECT_GE(::attend::testing::MetricValue(metrics, "attend_auth_rejections_total",
                                           {"reason=\"token_not_accepted\""}),
            2);
}

TEST_F(TlsTest, TheRightTokenWorksFromAFileOrTheLibrary) {
  std::vector<std::string> tokens = MutualFlags();
  tokens.insert(tokens.end(), {"--token_file", File("client_token"), "softmax", "2", "1", "0.5"});
  EXPECT_EQ(Run(tokens), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("0.628532"));
  // The second token of the server's file (rotation), through the library: every call of every
  // service carries it, a stream included.
  client::ConnectionOptions o = MutualOptions();
  o.bearer_token = kRotatedToken;
  ASSERT_OK(client::ValidateConnectionOptions(o));
  const std::shared_ptr<grpc::Channel> channel = client::Connect(o);
  const client::KvCacheClient kv(channel, o);
  EXPECT_OK(kv.Stats());
  v1::SequenceConfig config;
  config.set_layers(1);
  config.set_n_head(1);
  config.set_head_dim(4);
  ASSERT_OK(kv.CreateSequence(config, "tls-seq"));
  client::AppendInput append;
  append.sequence_id = "tls-seq";
  append.k = {{2, 1, 4}, std::vector<float>(8, 0.5f)};
  append.v = {{2, 1, 4}, std::vector<float>(8, 1.0f)};
  ASSERT_OK(kv.Append(append));
  std::unique_ptr<client::DecodeStream> stream = kv.OpenDecodeStream();
  client::DecodeBatchInput step;
  step.steps.push_back(
      {"tls-seq", {{1, 1, 4}, {1, 0, 0, 0}}, {{1, 1, 4}, {0, 1, 0, 0}}, {{1, 1, 4}, {1, 1, 1, 1}}});
  ASSERT_OK(stream->Write(step));
  absl::StatusOr<client::DecodeStreamReply> reply = stream->Read();
  ASSERT_OK(reply);
  ASSERT_OK(reply->result);
  EXPECT_EQ(reply->result->results[0].layer_tokens, 3);
  EXPECT_OK(stream->Finish());
  EXPECT_OK(kv.Release("tls-seq"));
  EXPECT_OK(client::PlannerClient(channel, o).ListModels());
}

TEST_F(TlsTest, EnvironmentConfiguresTheConnection) {
  const std::vector<std::pair<const char*, std::string>> env = {
      {"ATTEND_TARGET", "localhost:1"},  // the flag below wins
      {"ATTEND_TLS", "1"},
      {"ATTEND_CA_CERT", File("ca.pem")},
      {"ATTEND_CLIENT_CERT", File("client.pem")},
      {"ATTEND_CLIENT_KEY", File("client.key")},
      {"ATTEND_TOKEN_FILE", File("client_token")},
      {"ATTEND_KEEPALIVE_SECONDS", "10"}};
  for (const auto& [name, value] : env) setenv(name, value.c_str(), 1);
  const int code = Run({"--target", Localhost(mutual_server_), "seq", "stats"});
  setenv("ATTEND_TLS", "maybe", 1);
  const int bad_tls = Run({"health"});
  for (const auto& [name, value] : env) unsetenv(name);
  EXPECT_EQ(code, cli::kExitOk) << err_.str();
  EXPECT_EQ(bad_tls, cli::kExitUsage);
}

TEST_F(TlsTest, CommandLinesThatCannotWorkAreUsageErrors) {
  const std::string target = Localhost(tls_server_);
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--token", "t", "health"}, "a bearer token needs TLS"},
      {{"--ca_cert", File("ca.pem"), "health"}, "--ca_cert (or ATTEND_CA_CERT) needs --tls"},
      {{"--tls", "--client_cert", File("client.pem"), "health"}, "both the client certificate"},
      {{"--tls", "--token", "t", "--token_file", File("client_token"), "health"},
       "give the token once"},
      {{"--tls", "--token", "has space", "health"}, "printable ASCII without spaces"},
      {{"--keepalive_seconds", "5", "health"}, "at least 10s"},
      {{"--keepalive_seconds", "-1", "health"}, "--keepalive_seconds must be >= 0"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> tokens = {"--target", target};
    tokens.insert(tokens.end(), flags.begin(), flags.end());
    EXPECT_EQ(Run(tokens), cli::kExitUsage) << message;
    EXPECT_THAT(err_.str(), HasSubstr(message));
  }
  // Files that cannot be read are local errors.
  EXPECT_EQ(Run({"--target", target, "--tls", "--ca_cert", File("missing.pem"), "health"}),
            cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("--ca_cert: cannot open"));
  EXPECT_EQ(Run({"--target", target, "--tls", "--ca_cert", File("tokens"), "health"}),
            cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("is not PEM"));
}

TEST_F(TlsTest, KeepaliveIsSetOnTheChannelAndAccepted) {
  client::ConnectionOptions o = MutualOptions();
  o.bearer_token = kToken;
  o.keepalive = absl::Seconds(10);
  ASSERT_OK(client::ValidateConnectionOptions(o));
  grpc::ChannelArguments args = client::ChannelArgumentsFor(o);
  const grpc_channel_args c_args = args.c_channel_args();
  int keepalive_ms = -1, permit = -1;
  for (size_t i = 0; i < c_args.num_args; ++i) {
    const std::string key = c_args.args[i].key;
    if (key == GRPC_ARG_KEEPALIVE_TIME_MS) keepalive_ms = c_args.args[i].value.integer;
    if (key == GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS) permit = c_args.args[i].value.integer;
  }
  EXPECT_EQ(keepalive_ms, 10000);
  EXPECT_EQ(permit, 1);
  EXPECT_OK(client::KvCacheClient(client::Connect(o), o).Stats());
  o.keepalive = absl::Seconds(9);
  EXPECT_THAT(client::ValidateConnectionOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, {"at least 10s"}));
}

TEST_F(TlsTest, ServerRefusesConfigurationsThatCannotWork) {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.auth_tokens = {kToken};
  EXPECT_THAT(server::AttendServer::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument, {"need TLS", "clear text"}));
  EXPECT_THAT(server::LoadTlsFiles(File("server.pem"), "", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, {"go together"}));
  EXPECT_THAT(server::LoadTlsFiles("", "", File("ca.pem")),
              StatusIs(absl::StatusCode::kInvalidArgument, {"--tls_client_ca"}));
  EXPECT_THAT(server::LoadTlsFiles(File("tokens"), File("server.key"), ""),
              StatusIs(absl::StatusCode::kInvalidArgument, {"--tls_cert", "not PEM"}));
  EXPECT_THAT(server::LoadTlsFiles(File("nope.pem"), File("server.key"), ""),
              StatusIs(absl::StatusCode::kNotFound, {"--tls_cert: cannot open"}));
  // A key that does not belong to the certificate.
  server::ServerOptions mismatched = ::attend::testing::SmallServerOptions();
  mismatched.tls.cert_chain_pem = ReadFile(File("server.pem"));
  mismatched.tls.private_key_pem = ReadFile(File("client.key"));
  EXPECT_THAT(server::AttendServer::Start(mismatched),
              StatusIs(absl::StatusCode::kUnavailable, {"do not match"}));
}

TEST(Auth, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(server::ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(server::ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(server::ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(server::ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(server::ConstantTimeEquals("", "abc"));
  EXPECT_TRUE(server::ConstantTimeEquals("", ""));
  // A NUL byte is a byte like another.
  EXPECT_FALSE(server::ConstantTimeEquals(std::string("ab\0", 3), "ab"));
}

TEST(Auth, TokenFileHoldsOneTokenPerLine) {
  absl::StatusOr<std::vector<std::string>> tokens =
      server::ParseTokenFile("# comment\n  first \n\nsecond\r\n");
  ASSERT_OK(tokens);
  EXPECT_EQ(*tokens, (std::vector<std::string>{"first", "second"}));
  EXPECT_THAT(server::ParseTokenFile("# only a comment\n\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"no token"}));
  const absl::StatusOr<std::vector<std::string>> spaced =
      server::ParseTokenFile("fine\nhas secret space\n");
  EXPECT_THAT(spaced, StatusIs(absl::StatusCode::kInvalidArgument, {"line 2"}));
  EXPECT_THAT(std::string(spaced.status().message()), Not(HasSubstr("secret")));
}

TEST(Auth, ProcessorChecksTheBearerTokenAndConsumesIt) {
  std::vector<std::string> reasons;
  server::TokenAuthProcessor processor(
      {"tok1", "tok2"}, [&](absl::string_view reason) { reasons.emplace_back(reason); });
  const auto process = [&](std::vector<std::pair<std::string, std::string>> metadata,
                           grpc::AuthMetadataProcessor::OutputMetadata* consumed) {
    grpc::AuthMetadataProcessor::InputMetadata input;
    for (const auto& [key, value] : metadata) {
      input.insert({grpc::string_ref(key), grpc::string_ref(value)});
    }
    grpc::AuthMetadataProcessor::OutputMetadata response;
    return processor.Process(input, nullptr, consumed, &response);
  };
  const std::string attend_path = "/attend.v1.Attention/Softmax";
  const std::string health_path = "/grpc.health.v1.Health/Check";
  grpc::AuthMetadataProcessor::OutputMetadata consumed;
  EXPECT_TRUE(process({{":path", attend_path}, {"authorization", "Bearer tok2"}}, &consumed).ok());
  ASSERT_EQ(consumed.size(), 1u);
  EXPECT_EQ(consumed.begin()->first, "authorization");
  consumed.clear();
  EXPECT_EQ(process({{":path", attend_path}}, &consumed).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(process({{":path", attend_path}, {"authorization", "tok1"}}, &consumed).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(
      process({{":path", attend_path}, {"authorization", "Bearer tok3"}}, &consumed).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(process({{":path", health_path}}, &consumed).ok());
  EXPECT_TRUE(process({{":path", "/grpc.health.v1.Health/Watch"}}, &consumed).ok());
  // Only the health service's own path is open.
  EXPECT_EQ(process({{":path", "/grpc.health.v1.HealthX/Check"}}, &consumed).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(reasons, ::testing::ElementsAre("missing_token", "malformed_header",
                                              "token_not_accepted", "missing_token"));
}

}  // namespace
}  // namespace attend
