// `graphpipe checkpoint export --format pt|npz`: one file of named tensors from a checkpoint (a file,
// or a --checkpoint-dir's published generation) that PyTorch (`torch.load`) or NumPy (`numpy.load`)
// reads: every parameter by its "op/param" name, every optimizer state tensor as
// "op/param#field". The .npz is a zip of stored (uncompressed) .npy files written here.
#include <fmt/format.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <optional>
#include <map>

#include "runtime/launch/checkpoint_tool.h"
#include "runtime/checkpoint/checkpoint_set.h"
#include "support/error.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

uint32_t crc32(const std::string& bytes) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void put16(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v & 0xFF));
  s.push_back(static_cast<char>((v >> 8) & 0xFF));
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xFFFF);
  put16(s, v >> 16);
}

/// A .npy (format 1.0) of `t`: little-endian, C order; bfloat16 becomes float32 (NumPy has none).
std::string npy(torch::Tensor t) {
  t = t.detach().to(torch::kCPU).contiguous();
  if (t.scalar_type() == torch::kBFloat16) t = t.to(torch::kFloat32);
  std::string descr;
  switch (t.scalar_type()) {
    case torch::kFloat32: descr = "<f4"; break;
    case torch::kFloat64: descr = "<f8"; break;
    case torch::kFloat16: descr = "<f2"; break;
    case torch::kInt64: descr = "<i8"; break;
    case torch::kInt32: descr = "<i4"; break;
    default:
      throw RuntimeFailure(fmt::format("checkpoint export: no .npy type for {}", c10::toString(t.scalar_type())));
  }
  std::string shape;  // "()", "(3,)", "(3, 4)"
  for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
  if (t.dim() == 1) shape += ",";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  put16(out, static_cast<uint32_t>(header.size()));
  out += header;
  out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

/// A zip of stored entries (what numpy.load reads as an .npz).
std::string zip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, central;
  for (const auto& [name, data] : entries) {
    GP_CHECK(data.size() < 0xFFFFFFFFull && out.size() < 0xFFFFFFFFull,
             "checkpoint export --format npz: {} makes the archive larger than 4 GiB (zip64 is not written); use "
             "--format pt",
             name);
    const uint32_t crc = crc32(data), size = static_cast<uint32_t>(data.size()), at = static_cast<uint32_t>(out.size());
    auto header = [&](std::string& s, bool central_entry) {
      put32(s, central_entry ? 0x02014b50u : 0x04034b50u);
      if (central_entry) put16(s, 20);  // made by
      put16(s, 20);                     // needed to extract
      put16(s, 0);                      // flags
      put16(s, 0);                      // stored
      put16(s, 0);                      // time
      put16(s, 0x21);                   // date: 1980-01-01
      put32(s, crc);
      put32(s, size);
      put32(s, size);
      put16(s, static_cast<uint32_t>(name.size()));
      put16(s, 0);  // extra
      if (central_entry) {
        put16(s, 0);  // comment
        put16(s, 0);  // disk
        put16(s, 0);  // internal attributes
        put32(s, 0);  // external attributes
        put32(s, at);
      }
      s += name;
    };
    header(out, false);
    out += data;
    header(central, true);
  }
  const uint32_t central_at = static_cast<uint32_t>(out.size());
  out += central;
  put32(out, 0x06054b50u);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint32_t>(entries.size()));
  put16(out, static_cast<uint32_t>(entries.size()));
  put32(out, static_cast<uint32_t>(central.size()));
  put32(out, central_at);
  put16(out, 0);
  return out;
}

}  // namespace

std::string export_checkpoint(const std::string& path, const std::string& format, const std::string& out) {
  GP_CHECK(format == "pt" || format == "npz", "checkpoint export --format: expected pt or npz, found \"{}\"", format);
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    std::optional<Generation> gen = published_generation(path);
    GP_CHECK(gen.has_value(), "{}: holds no checkpoint to export", path);
    files = gen->flat() ? std::vector<std::string>{} : gen->files();
    if (gen->flat())
      for (auto& e : fs::directory_iterator(path))
        if (e.path().extension() == ".pt") files.push_back(e.path().string());
  } else {
    GP_CHECK(fs::is_regular_file(path), "{}: no such checkpoint file or directory", path);
    files = {path};
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, torch::Tensor> tensors;  // copies of one name (replicas, shared parameters) are equal
  int64_t steps = -1, params = 0;
  for (const auto& f : files) {
    CheckpointContents c = read_checkpoint(f);  // checksums verified
    GP_CHECK(steps < 0 || steps == c.steps_done, "{}: {} steps done, other files of {} {}", f, c.steps_done, path,
             steps);
    steps = c.steps_done;
    for (auto& [n, t] : c.params) params += tensors.emplace(n, t).second;
    for (auto& [n, t] : c.optimizer_state) tensors.emplace(n, t);
  }
  std::string bytes;
  if (format == "pt") {
    c10::Dict<std::string, torch::Tensor> dict;
    for (auto& [n, t] : tensors) dict.insert(n, t.detach().to(torch::kCPU).contiguous());
    // torch::pickle_save, but without type tags on the dict: torch.load's default (weights_only)
    // refuses the tag's restore function.
    std::vector<char> pickled;
    torch::jit::Pickler pickler([&](const char* b, size_t n) { pickled.insert(pickled.end(), b, b + n); }, nullptr,
                                nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(c10::IValue(dict));
    pickler.stop();
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* b, size_t n) {
      bytes.append(static_cast<const char*>(b), n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  } else {
    std::vector<std::pair<std::string, std::string>> entries;
    for (auto& [n, t] : tensors) entries.emplace_back(n + ".npy", npy(t));
    bytes = zip(entries);
  }
  write_file_atomically(out, bytes, "export");
  return fmt::format("wrote {}: {} tensors ({} parameters, {} optimizer state) after {} steps, from {} file(s) of {}\n",
                     out, tensors.size(), params, static_cast<int64_t>(tensors.size()) - params, steps, files.size(),
                     path);
}

}  // namespace gp::runtime
