// Model files the planner tests share: a GGUF header writer, the lessons' tiny model as a GGUF
// header, and a published Hugging Face config.json. Test-only; header-only.
#ifndef ATTEND_TESTS_PLANNER_MODEL_FILES_H_
#define ATTEND_TESTS_PLANNER_MODEL_FILES_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "planner/import/gguf_format.h"

namespace attend::planner::testing {

// Writes little GGUF headers: "GGUF", version, tensor_count, kv_count, then the key/values.
class GgufWriter {
 public:
  template <typename T>
  static void Put(std::string* out, T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out->append(bytes, sizeof(T));
  }
  static void PutString(std::string* out, const std::string& s) {
    Put<uint64_t>(out, s.size());
    out->append(s);
  }

  template <typename T>
  GgufWriter& Scalar(const std::string& key, uint32_t type, T value) {
    Key(key, type);
    Put(&body_, value);
    return *this;
  }
  GgufWriter& U32(const std::string& key, uint32_t v) { return Scalar(key, gguf::kU32, v); }
  GgufWriter& U64(const std::string& key, uint64_t v) { return Scalar(key, gguf::kU64, v); }
  GgufWriter& F32(const std::string& key, float v) { return Scalar(key, gguf::kF32, v); }
  GgufWriter& Str(const std::string& key, const std::string& v) {
    Key(key, gguf::kString);
    PutString(&body_, v);
    return *this;
  }
  template <typename T>
  GgufWriter& Array(const std::string& key, uint32_t element_type, const std::vector<T>& v) {
    Key(key, gguf::kArray);
    Put<uint32_t>(&body_, element_type);
    Put<uint64_t>(&body_, v.size());
    for (const T& x : v) Put(&body_, x);
    return *this;
  }
  GgufWriter& StrArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key, gguf::kArray);
    Put<uint32_t>(&body_, gguf::kString);
    Put<uint64_t>(&body_, v.size());
    for (const std::string& s : v) PutString(&body_, s);
    return *this;
  }
  // A key followed by raw value bytes (type included), for hostile values.
  GgufWriter& Raw(const std::string& key, const std::string& type_and_value) {
    PutString(&body_, key);
    body_ += type_and_value;
    ++count_;
    return *this;
  }

  std::string Build(uint32_t version = 3, uint64_t tensor_count = 291) const {
    return Header(version, tensor_count, count_) + body_;
  }
  static std::string Header(uint32_t version, uint64_t tensor_count, uint64_t kv_count) {
    std::string out(gguf::kMagic);
    Put(&out, version);
    Put(&out, tensor_count);
    Put(&out, kv_count);
    return out;
  }

 private:
  void Key(const std::string& key, uint32_t type) {
    PutString(&body_, key);
    Put(&body_, type);
    ++count_;
  }

  std::string body_;
  uint64_t count_ = 0;
};

// The lessons' tiny model (4 layers, 8 query heads, 2 KV heads, head size 32) as llama.cpp
// would write its GGUF header (f16 weights; tensor infos would follow, and are not read).
inline GgufWriter TinyGguf() {
  GgufWriter w;
  w.Str("general.architecture", "llama")
      .Str("general.name", "Tiny Lesson Model")
      .U32("llama.block_count", 4)
      .U32("llama.context_length", 4096)
      .U32("llama.embedding_length", 256)
      .U32("llama.feed_forward_length", 768)
      .U32("llama.attention.head_count", 8)
      .U32("llama.attention.head_count_kv", 2)
      .U32("llama.vocab_size", 32000)
      .U32("general.file_type", 1);  // LLAMA_FTYPE_MOSTLY_F16
  return w;
}

// The published config.json of meta-llama/Meta-Llama-3-8B, as on its Hugging Face page.
inline constexpr char kLlama3_8BConfig[] = R"({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
)";

}  // namespace attend::planner::testing

#endif  // ATTEND_TESTS_PLANNER_MODEL_FILES_H_
