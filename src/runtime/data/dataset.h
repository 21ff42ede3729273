// Real training data: `train --data DIR`, one NumPy .npy file per graph input (first dimension =
// sample), memory-mapped read-only so datasets larger than RAM work. Torch-free; the runtime turns
// the rows it gathers into tensors (exec/stage_module.h, external_inputs).
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/model.h"

namespace gp::runtime {

/// One .npy file (format versions 1-3, little-endian, C order), memory-mapped. Move-only.
class NpyFile {
 public:
  enum class Kind { f16, f32, f64, i32, i64 };

  /// UserError naming the file: missing or unreadable, not a .npy file, an unsupported dtype
  /// (anything but float16/32/64, int32/64) or layout (Fortran order, big-endian), a malformed
  /// header, a 0-d array, or fewer data bytes than the header's shape needs (truncated).
  static NpyFile open(const std::string& path);

  NpyFile() = default;
  NpyFile(NpyFile&& o) noexcept;
  NpyFile& operator=(NpyFile&& o) noexcept;
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;
  ~NpyFile();

  const std::string& path() const { return path_; }
  Kind kind() const { return kind_; }
  const std::string& descr() const { return descr_; }  // as in the header, e.g. "<f4"
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t samples() const { return shape_[0]; }
  int64_t row_elems() const { return row_elems_; }
  /// Sample `i`'s values (row_elems() of kind()).
  const uint8_t* row(int64_t i) const { return data_ + static_cast<size_t>(i) * row_bytes_; }

 private:
  std::string path_, descr_;
  Kind kind_ = Kind::f32;
  std::vector<int64_t> shape_;
  int64_t row_elems_ = 0;
  size_t row_bytes_ = 0;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* data_ = nullptr;
};

/// "float32", "int64", ... for messages.
const char* npy_kind_name(NpyFile::Kind k);

/// The files of `dir` for the graph inputs of `g`, checked against the model, and the order in
/// which samples are visited.
///
/// Sample order: the global position of sample j of step k is p = k * B + j (B the mini-batch);
/// it reads row p mod N (file order), or with `shuffle` row perm_e[p mod N] of epoch e = p / N,
/// perm_e a permutation seeded by (seed, e): identical on every rank, different per epoch.
class Dataset {
 public:
  /// Opens `<dir>/<input>.npy` for every graph input of `g`. `flag` ("--data", "--eval-data") starts
  /// every message. UserError (naming the file) for a missing file, a dtype that does not fit the
  /// input (f32 inputs take float16/32/64, i64 inputs int32/64), a per-sample shape that differs
  /// from the input's, files with different sample counts, an empty dataset, and, with
  /// `check_values`, an index or label outside [0, range) (range as runtime::index_range).
  static std::shared_ptr<const Dataset> open(const std::string& dir, const ir::Graph& g, const std::string& flag,
                                             bool check_values, bool shuffle = false, uint64_t seed = 1);

  const std::string& dir() const { return dir_; }
  int64_t size() const { return n_; }
  bool shuffled() const { return shuffle_; }
  /// The dataset row global position `pos` reads (see the class comment) and its epoch.
  int64_t row_of(int64_t pos) const;
  int64_t epoch_of(int64_t pos) const { return pos / n_; }

  /// Writes the samples at global positions [first_pos, first_pos + count) of graph input `input`
  /// (an index into g.model().inputs) to `out`: float32 values for an f32 input, int64 for an i64
  /// one, row after row (count * per-sample elements).
  void gather(int input, int64_t first_pos, int64_t count, void* out) const;
  /// Rows of graph input `input` gathered so far (by every user of this object): what a run read.
  int64_t rows_read(int input) const { return rows_read_[static_cast<size_t>(input)].load(); }

 private:
  Dataset() = default;
  const std::vector<int64_t>& permutation(int64_t epoch) const;

  std::string dir_;
  int64_t n_ = 0;
  bool shuffle_ = false;
  uint64_t seed_ = 1;
  std::vector<NpyFile> files_;                         // per graph input (in g.model().inputs order)
  std::vector<bool> index_;                            // input is i64
  std::unique_ptr<std::atomic<int64_t>[]> rows_read_;  // per input
  mutable std::mutex mu_;                              // the permutation cache (ranks may share a Dataset as threads)
  mutable std::vector<std::pair<int64_t, std::vector<int64_t>>> perms_;  // the latest epochs used
};

}  // namespace gp::runtime
