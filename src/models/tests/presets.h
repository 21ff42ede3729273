// Small presets of every builtin, shared by the zoo, inspection and importer tests.
#pragma once
#include <string>
#include <vector>

namespace gp::models::testing {

inline const std::vector<std::string>& small_presets() {
  static const std::vector<std::string> v = {
      "mmt:branches=2,layers=2,seq=16,hidden=64,heads=4,ffn=128,classes=10",
      "dlrm:dense_branches=2,embedding_branches=3,layers=2,hidden=32,rows=100,dim=8,bag=4",
      "candle-uno:branches=3,layers=2,hidden=32",
      "gpt:layers=2,seq=16,hidden=64,heads=4,ffn=128,vocab=100",
      "inception:blocks=3,channels=8,image=32,classes=10",
  };
  return v;
}

}  // namespace gp::models::testing
