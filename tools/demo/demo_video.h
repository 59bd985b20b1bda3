// Generates the demo's clips: a moving pattern encoded with libav (MPEG-4 Part 2 in AVI, both in
// every FFmpeg build), each with a same-stem caption, so the demo's video part needs no program
// beside sanaflow.
#pragma once

#include <string>

namespace sf::tools {

// Writes `count` clips of `frames` frames at 8 fps, 64 x 48, into `dir` (created), with captions.
// sf::Error kIOError naming the file when libav cannot write it.
void write_demo_clips(const std::string& dir, int count, int frames, unsigned seed);

}  // namespace sf::tools
