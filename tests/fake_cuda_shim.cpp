// A fake CUDA device for a CPU-only build of torch, so that `FakeTensorMode` can run "cuda" tensors through torch's
// meta kernels, forward and backward (tests/fake_cuda.py builds and loads this before torch is imported; see there).
//
// A CPU build of torch has no CUDA device guard and no CUDA hooks. Two registrations stand in for them:
// - a device guard for CUDA: one device, one stream, events that do nothing (c10's own FakeGuardImpl, written for
//   its tests, does the same with eight devices). FakeTensorMode's `_ensureCUDADeviceGuardSet()` only installs a fake
//   guard where a CUDA build found no GPU; a CPU build has no guard at all.
// - CUDA hooks that say CUDA is built and available, but only while `seqbert_fake_cuda_enable(true)` holds (the
//   harness sets it while its fake GPU is entered): autograd's engine asks `at::getAccelerator()` for the current
//   stream of a CUDA tensor's backward, and that reads `getCUDAHooks().isBuilt()`. Disabled, every answer is the CPU
//   build's own (the base class's), so the rest of the test suite sees an ordinary CPU build.
// `getCUDAHooks()` creates its hooks once per process, on first use, and `import torch` uses them: this library must be
// loaded before torch is imported.
//
// Test code, pinned to the torch release whose headers it was compiled against (tests/fake_cuda_shim.py).

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <memory>

namespace {

std::atomic<bool> enabled{false};

struct FakeCUDAGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device device) const override { return getDevice(); }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::CUDA, 0); }
  void setDevice(c10::Device device) const override {}
  void uncheckedSetDevice(c10::Device device) const noexcept override {}
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA, 0));
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override { return getStream(stream.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {}
  void block(void* event, const c10::Stream& stream) const override {}
  bool queryEvent(void* event) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {}
};

struct FakeCUDAHooks final : at::CUDAHooksInterface {
  explicit FakeCUDAHooks(at::CUDAHooksArgs) {}
  bool isBuilt() const override { return enabled.load() || at::CUDAHooksInterface::isBuilt(); }
  bool isAvailable() const override { return enabled.load() || at::CUDAHooksInterface::isAvailable(); }
  bool hasCUDA() const override { return enabled.load() || at::CUDAHooksInterface::hasCUDA(); }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return enabled.load() || at::CUDAHooksInterface::hasPrimaryContext(device_index);
  }
  c10::DeviceIndex current_device() const override {
    return enabled.load() ? 0 : at::CUDAHooksInterface::current_device();
  }
  int getNumGPUs() const override { return enabled.load() ? 1 : at::CUDAHooksInterface::getNumGPUs(); }
};

const FakeCUDAGuard fake_guard;

const bool registered = [] {
  c10::impl::registerDeviceGuard(c10::DeviceType::CUDA, &fake_guard);
  at::CUDAHooksRegistry()->Register(
      "CUDAHooks",
      [](at::CUDAHooksArgs args) -> std::unique_ptr<at::CUDAHooksInterface> {
        return std::make_unique<FakeCUDAHooks>(args);
      });
  return true;
}();

}  // namespace

extern "C" void seqbert_fake_cuda_enable(bool on) { enabled.store(on); }
extern "C" bool seqbert_fake_cuda_registered() { return registered; }
