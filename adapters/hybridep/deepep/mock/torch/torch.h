#pragma once
// compile-only stand-in for the parts of libtorch that DeepEP's intranode.cu and allgather.cu use
// (check-compile.sh: the patched allocator call sites compiled without PyTorch)
#include <cstdint>
#include <initializer_list>
#include <pybind11/pybind11.h>
namespace py = pybind11;  // (libtorch's headers give DeepEP this alias)
#include <optional>
namespace c10 { enum class ScalarType { Byte }; template <class T> using optional = std::optional<T>; }
namespace torch {
constexpr c10::ScalarType kUInt8 = c10::ScalarType::Byte;
enum DeviceType { kCPU, kCUDA };
struct TensorOptions {
  TensorOptions dtype(c10::ScalarType) const { return *this; }
  TensorOptions device(DeviceType) const { return *this; }
};
inline TensorOptions dtype(c10::ScalarType) { return TensorOptions(); }
struct Tensor {
  template <class T> T *data_ptr() const { return nullptr; }
  void *data_ptr() const { return nullptr; }
  Tensor cuda() const { return *this; }
  Tensor cpu() const { return *this; }
  int64_t numel() const { return 0; }
  int64_t element_size() const { return 1; }
  int64_t size(int) const { return 0; }
  int64_t dim() const { return 0; }
  bool is_cuda() const { return true; }
  bool is_contiguous() const { return true; }
  c10::ScalarType scalar_type() const { return c10::ScalarType::Byte; }
  Tensor view(std::initializer_list<int64_t>) const { return *this; }
};
inline Tensor empty(std::initializer_list<int64_t>, TensorOptions) { return Tensor(); }
inline Tensor empty_like(const Tensor &) { return Tensor(); }
}
#define TORCH_WARN(...) ((void)0)
