# The bridge to antirez's h3.c (MiniMax-H3 on Metal), included by CMakeLists.txt
# right after add_library(h3render ...).
#
# Off unless H3_SOURCE_DIR (a CMake variable or an environment variable) names
# the user's h3.c checkout, in which the user has already run h3.c's own build
# (its README: `make`), which leaves h3.h, h3_shaders.metal and libh3.a there.
# Then, on macOS, the target h3render is built from csrc/h3bridge/h3bridge.c
# alone, instead of the CPU engine's sources, and links libh3.a statically with
# the frameworks h3.c needs. On any other system this file only warns.
#
#   H3_SOURCE_DIR=$HOME/src/h3.c pip install .
#   cmake -S . -B build -DH3_SOURCE_DIR=$HOME/src/h3.c
#
# Nothing here builds h3.c; this repository holds none of its code.

if(NOT H3_SOURCE_DIR AND DEFINED ENV{H3_SOURCE_DIR})
  set(H3_SOURCE_DIR "$ENV{H3_SOURCE_DIR}")
endif()
if(NOT H3_SOURCE_DIR)
  return()
endif()

if(NOT APPLE)
  message(WARNING
    "H3_SOURCE_DIR=${H3_SOURCE_DIR} is set, but h3.c runs only on macOS with Metal; "
    "building the portable CPU engine instead.")
  return()
endif()

get_filename_component(H3_SOURCE_DIR "${H3_SOURCE_DIR}" REALPATH BASE_DIR "${CMAKE_SOURCE_DIR}")
foreach(_h3_file h3.h h3_shaders.metal libh3.a)
  if(NOT EXISTS "${H3_SOURCE_DIR}/${_h3_file}")
    message(FATAL_ERROR
      "H3_SOURCE_DIR=${H3_SOURCE_DIR} has no ${_h3_file}. Point H3_SOURCE_DIR at an h3.c "
      "checkout and build it there first as h3.c's README says (its Makefile's default "
      "target produces libh3.a); see docs/H3C.md.")
  endif()
endforeach()

message(STATUS "h3render: building the h3.c bridge against ${H3_SOURCE_DIR}")
set_property(TARGET h3render PROPERTY SOURCES
             "${CMAKE_CURRENT_SOURCE_DIR}/csrc/h3bridge/h3bridge.c")
target_include_directories(h3render PRIVATE "${H3_SOURCE_DIR}")
# The bridge looks for h3_shaders.metal here when the working directory has none.
target_compile_definitions(h3render PRIVATE "H3R_H3_SOURCE_DIR=\"${H3_SOURCE_DIR}\"")
target_link_libraries(h3render PRIVATE
  "${H3_SOURCE_DIR}/libh3.a"
  "-framework Foundation"
  "-framework Metal"
  "-framework MetalPerformanceShaders"
  "-framework MetalPerformanceShadersGraph"
  "-framework Accelerate"
  icucore objc m)
# Rebuild when the user rebuilds h3.c.
set_property(TARGET h3render APPEND PROPERTY LINK_DEPENDS "${H3_SOURCE_DIR}/libh3.a")
