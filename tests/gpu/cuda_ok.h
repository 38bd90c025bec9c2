// Assertion for CUDA runtime calls made by the GPU tests themselves (streams, graphs): a failed
// call fails the test with the call's text.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
