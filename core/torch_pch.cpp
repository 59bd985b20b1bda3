// The unit that builds the shared precompiled <torch/torch.h> (see the top-level CMakeLists.txt).
