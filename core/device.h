// Devices. The device is part of every tensor's type from the start.
#pragma once
#include <ostream>

namespace tg {

enum class Device { CPU, CUDA };

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }
inline std::ostream& operator<<(std::ostream& os, Device d) { return os << device_name(d); }

// True when this build has the CUDA backend compiled in.
bool built_with_cuda();

}  // namespace tg
