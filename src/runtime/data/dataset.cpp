// NumPy .npy reading (memory-mapped) and the dataset of `train --data`: checks against the model,
// the sample order (in file order or a seeded per-epoch permutation) and row gathering.
#include "runtime/data/dataset.h"

#include <fmt/ranges.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>
#include <utility>

#include "runtime/exec/synthetic.h"
#include "support/error.h"

namespace gp::runtime {

namespace {

namespace fs = std::filesystem;

size_t kind_bytes(NpyFile::Kind k) {
  switch (k) {
    case NpyFile::Kind::f16: return 2;
    case NpyFile::Kind::f32:
    case NpyFile::Kind::i32: return 4;
    case NpyFile::Kind::f64:
    case NpyFile::Kind::i64: return 8;
  }
  return 0;
}

NpyFile::Kind parse_descr(const std::string& path, const std::string& d) {
  GP_CHECK(d.size() >= 3, "{}: unsupported dtype '{}'", path, d);
  GP_CHECK(d[0] != '>', "{}: dtype '{}' is big-endian; save it little-endian (arr.astype(arr.dtype.newbyteorder('<')))",
           path, d);
  std::string t = d.substr(1);
  if (t == "f2") return NpyFile::Kind::f16;
  if (t == "f4") return NpyFile::Kind::f32;
  if (t == "f8") return NpyFile::Kind::f64;
  if (t == "i4") return NpyFile::Kind::i32;
  if (t == "i8") return NpyFile::Kind::i64;
  throw UserError(fmt::format("{}: unsupported dtype '{}' (valid: float16, float32, float64, int32, int64)", path, d));
}

/// The value of `key` in the header dict ("'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), ").
std::string header_field(const std::string& path, const std::string& header, const std::string& key,
                         const std::string& value_re) {
  std::smatch m;
  std::regex re("['\"]" + key + "['\"]\\s*:\\s*(" + value_re + ")");
  GP_CHECK(std::regex_search(header, m, re), "{}: malformed .npy header (no '{}'): {}", path, key, header);
  return m[1].str();
}

std::vector<int64_t> parse_shape(const std::string& path, const std::string& s) {
  std::vector<int64_t> shape;
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), num); it != std::sregex_iterator(); ++it) {
    GP_CHECK(it->str().size() <= 15, "{}: dimension {} in the .npy header is too large", path, it->str());
    shape.push_back(std::stoll(it->str()));
  }
  return shape;
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400u));
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename From, typename To>
void convert(const uint8_t* src, int64_t n, To* dst) {
  for (int64_t i = 0; i < n; ++i) {
    From v;
    std::memcpy(&v, src + i * sizeof(From), sizeof(From));
    dst[i] = static_cast<To>(v);
  }
}

/// A stable 64-bit generator for the shuffle (splitmix64): the same permutation on every platform.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) {  // unbiased, Lemire's multiply-shift with rejection
    uint64_t x = next();
    __uint128_t m = static_cast<__uint128_t>(x) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      uint64_t t = -n % n;
      while (low < t) {
        x = next();
        m = static_cast<__uint128_t>(x) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

/// UserError naming the file, the sample and the value when an index or label is outside [0, range).
void check_index_values(const std::string& flag, const NpyFile& f, int64_t range, const std::string& input,
                        std::optional<int64_t> ignored) {
  const int64_t e = f.row_elems();
  for (int64_t s = 0; s < f.samples(); ++s) {
    const uint8_t* row = f.row(s);
    for (int64_t k = 0; k < e; ++k) {
      int64_t v;
      if (f.kind() == NpyFile::Kind::i64) {
        std::memcpy(&v, row + 8 * k, 8);
      } else {
        int32_t w;
        std::memcpy(&w, row + 4 * k, 4);
        v = w;
      }
      GP_CHECK((v >= 0 && v < range) || (ignored && v == *ignored),
               "{} {}: sample {} has value {} for model input \"{}\", outside [0, {}){}", flag, f.path(), s, v, input,
               range, ignored ? fmt::format(" (and not the ignored label {})", *ignored) : "");
    }
  }
}

}  // namespace

const char* npy_kind_name(NpyFile::Kind k) {
  switch (k) {
    case NpyFile::Kind::f16: return "float16";
    case NpyFile::Kind::f32: return "float32";
    case NpyFile::Kind::f64: return "float64";
    case NpyFile::Kind::i32: return "int32";
    case NpyFile::Kind::i64: return "int64";
  }
  return "?";
}

NpyFile::NpyFile(NpyFile&& o) noexcept { *this = std::move(o); }

NpyFile& NpyFile::operator=(NpyFile&& o) noexcept {
  if (this == &o) return *this;
  if (map_) ::munmap(map_, map_bytes_);
  path_ = std::move(o.path_);
  descr_ = std::move(o.descr_);
  kind_ = o.kind_;
  shape_ = std::move(o.shape_);
  row_elems_ = o.row_elems_;
  row_bytes_ = o.row_bytes_;
  map_ = std::exchange(o.map_, nullptr);
  map_bytes_ = std::exchange(o.map_bytes_, 0);
  data_ = std::exchange(o.data_, nullptr);
  return *this;
}

NpyFile::~NpyFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

NpyFile NpyFile::open(const std::string& path) {
  NpyFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  GP_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0;
  size_t size = ok ? static_cast<size_t>(st.st_size) : 0;
  void* map = nullptr;
  if (ok && S_ISREG(st.st_mode) && size > 0) map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  GP_CHECK(ok && S_ISREG(st.st_mode), "{}: not a regular file", path);
  GP_CHECK(size > 0, "{}: empty file, not a .npy file", path);
  GP_CHECK(map != MAP_FAILED, "{}: cannot map the file: {}", path, std::strerror(map_errno));
  f.map_ = map;
  f.map_bytes_ = size;
  const auto* p = static_cast<const uint8_t*>(f.map_);
  GP_CHECK(size >= 10 && std::memcmp(p, "\x93NUMPY", 6) == 0,
           "{}: not a .npy file (no \\x93NUMPY magic; save arrays with numpy.save)", path);
  int major = p[6];
  GP_CHECK(major >= 1 && major <= 3, "{}: unsupported .npy format version {}.{}", path, major, int(p[7]));
  size_t len_bytes = major == 1 ? 2 : 4, header_len = 0;
  GP_CHECK(size >= 8 + len_bytes, "{}: truncated .npy header", path);
  for (size_t i = 0; i < len_bytes; ++i) header_len |= size_t{p[8 + i]} << (8 * i);
  size_t data_off = 8 + len_bytes + header_len;
  GP_CHECK(data_off <= size, "{}: truncated .npy header ({} bytes announced, the file has {})", path, header_len, size);
  std::string header(reinterpret_cast<const char*>(p + 8 + len_bytes), header_len);
  f.descr_ = header_field(path, header, "descr", "'[^']*'|\"[^\"]*\"");
  f.descr_ = f.descr_.substr(1, f.descr_.size() - 2);
  f.kind_ = parse_descr(path, f.descr_);
  std::string fortran = header_field(path, header, "fortran_order", "True|False");
  f.shape_ = parse_shape(path, header_field(path, header, "shape", "\\([^)]*\\)"));
  GP_CHECK(!f.shape_.empty(), "{}: a 0-d array; the first dimension must be the sample", path);
  double elems = 1;
  for (size_t i = 1; i < f.shape_.size(); ++i) elems *= double(f.shape_[i]);
  GP_CHECK(elems * double(std::max<int64_t>(f.shape_[0], 1)) < 0x1p62, "{}: shape [{}] is too large", path,
           fmt::join(f.shape_, ", "));
  f.row_elems_ = static_cast<int64_t>(elems);
  bool multi_dim = std::count_if(f.shape_.begin(), f.shape_.end(), [](int64_t d) { return d > 1; }) > 1;
  GP_CHECK(fortran == "False" || !multi_dim, "{}: Fortran-ordered array; save it in C order (numpy.ascontiguousarray)",
           path);
  f.row_bytes_ = static_cast<size_t>(f.row_elems_) * kind_bytes(f.kind_);
  double need = double(f.row_bytes_) * double(f.shape_[0]);
  GP_CHECK(need <= double(size - data_off), "{}: truncated: shape [{}] of {} needs {} data bytes, the file has {}",
           path, fmt::join(f.shape_, ", "), f.descr_, static_cast<uint64_t>(need), size - data_off);
  f.data_ = p + data_off;
  return f;
}

std::shared_ptr<const Dataset> Dataset::open(const std::string& dir, const ir::Graph& g, const std::string& flag,
                                             bool check_values, bool shuffle, uint64_t seed) {
  GP_CHECK(fs::is_directory(dir), "{} {}: not a directory", flag, dir);
  std::shared_ptr<Dataset> d(new Dataset());
  d->dir_ = dir;
  d->shuffle_ = shuffle;
  d->seed_ = seed;
  const auto& inputs = g.model().inputs;
  std::vector<std::string> present;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".npy") present.push_back(e.path().filename().string());
  std::sort(present.begin(), present.end());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::Input& in = inputs[i];
    std::string path = (fs::path(dir) / (in.name + ".npy")).string();
    GP_CHECK(fs::exists(path), "{} {}: missing {}.npy for model input \"{}\" (the directory has: {})", flag, dir,
             in.name, in.name, present.empty() ? "no .npy files" : fmt::format("{}", fmt::join(present, ", ")));
    NpyFile f = NpyFile::open(path);
    bool index = in.dtype == ir::DType::i64;
    bool fits = index ? (f.kind() == NpyFile::Kind::i64 || f.kind() == NpyFile::Kind::i32)
                      : !(f.kind() == NpyFile::Kind::i64 || f.kind() == NpyFile::Kind::i32);
    GP_CHECK(fits, "{} {}: dtype {} does not fit model input \"{}\" ({}; use {})", flag, path, npy_kind_name(f.kind()),
             in.name, index ? "indices" : "float features",
             index ? "int64 or int32" : "float32, or float16/float64 (converted)");
    std::vector<int64_t> want(in.shape.begin() + 1, in.shape.end()), got(f.shape().begin() + 1, f.shape().end());
    GP_CHECK(want == got, "{} {}: per-sample shape [{}] (file shape [{}]) does not match model input \"{}\" [{}]", flag,
             path, fmt::join(got, ", "), fmt::join(f.shape(), ", "), in.name, fmt::join(want, ", "));
    if (i == 0) d->n_ = f.samples();
    GP_CHECK(f.samples() == d->n_, "{} {}: {} samples, but {}.npy has {} (every file needs the same count)", flag, path,
             f.samples(), inputs[0].name, d->n_);
    d->files_.push_back(std::move(f));
    d->index_.push_back(index);
  }
  GP_CHECK(!inputs.empty() && d->n_ > 0, "{} {}: the dataset has no samples", flag, dir);
  d->rows_read_.reset(new std::atomic<int64_t>[inputs.size()]);
  for (size_t i = 0; i < inputs.size(); ++i) d->rows_read_[i] = 0;
  if (check_values)
    for (size_t i = 0; i < inputs.size(); ++i)
      if (d->index_[i])
        check_index_values(flag, d->files_[i], index_range(g, static_cast<int>(i)), inputs[i].name,
                           ignored_label(g, static_cast<int>(i)));
  return d;
}

const std::vector<int64_t>& Dataset::permutation(int64_t epoch) const {
  // Callers hold mu_. Two epochs are cached: a mini-batch may span an epoch boundary.
  for (auto& [e, perm] : perms_)
    if (e == epoch) return perm;
  std::vector<int64_t> perm(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i) perm[static_cast<size_t>(i)] = i;
  SplitMix rng{seed_ * 0x2545f4914f6cdd1dull ^ (static_cast<uint64_t>(epoch) + 0x5851f42d4c957f2dull)};
  for (int64_t i = n_ - 1; i > 0; --i)  // Fisher-Yates
    std::swap(perm[static_cast<size_t>(i)], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
  if (perms_.size() >= 2) perms_.erase(perms_.begin());
  perms_.emplace_back(epoch, std::move(perm));
  return perms_.back().second;
}

int64_t Dataset::row_of(int64_t pos) const {
  int64_t r = pos % n_;
  if (!shuffle_) return r;
  std::lock_guard<std::mutex> lock(mu_);
  return permutation(pos / n_)[static_cast<size_t>(r)];
}

void Dataset::gather(int input, int64_t first_pos, int64_t count, void* out) const {
  const NpyFile& f = files_.at(static_cast<size_t>(input));
  const int64_t e = f.row_elems();
  rows_read_[static_cast<size_t>(input)] += count;
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* src = f.row(row_of(first_pos + i));
    if (index_[static_cast<size_t>(input)]) {
      auto* dst = static_cast<int64_t*>(out) + i * e;
      if (f.kind() == NpyFile::Kind::i64) std::memcpy(dst, src, static_cast<size_t>(e) * 8);
      else convert<int32_t>(src, e, dst);
      continue;
    }
    auto* dst = static_cast<float*>(out) + i * e;
    if (f.kind() == NpyFile::Kind::f32) {
      std::memcpy(dst, src, static_cast<size_t>(e) * 4);
    } else if (f.kind() == NpyFile::Kind::f64) {
      convert<double>(src, e, dst);
    } else {
      for (int64_t k = 0; k < e; ++k) {
        uint16_t h;
        std::memcpy(&h, src + 2 * k, 2);
        dst[k] = half_to_float(h);
      }
    }
  }
}

}  // namespace gp::runtime
