# The headers `cmake --install` puts under PREFIX/include/moeblaze/, staged in OUT_DIR:
#   cmake -DSOURCE_DIR=... -DOUT_DIR=... -DENTRIES=runtime/moe_layer.hpp:capi/c_api.h:... -DSTAMP=... -P StageHeaders.cmake
# The public headers are ENTRIES and every header they include, transitively: no other header of
# the tree (SQLite's wrappers, the NVRTC table, launch internals) is installed. Inside the tree a
# layer's header is included as "<layer>/<header>" (docs/layers.md); installed, every such include
# is spelled "moeblaze/<layer>/<header>", so a consumer's include path holds PREFIX/include only
# and names nothing outside moeblaze/. The kernel headers the host shares ("moeblaze/common.cuh")
# are spelled that way already and land beside the layers' folders.
cmake_minimum_required(VERSION 3.24)  # policies of a script run with -P
set(layers core generator cache runtime testing tuner capi)
string(REPLACE ";" "|" layer_alternatives "${layers}")

file(REMOVE_RECURSE ${OUT_DIR})
string(REPLACE ":" ";" todo "${ENTRIES}")
set(done "")
while(todo)
  list(POP_FRONT todo header)
  if(header IN_LIST done)
    continue()
  endif()
  list(APPEND done ${header})
  if(header MATCHES "^moeblaze/")
    set(source ${SOURCE_DIR}/templates/${header})
  else()
    set(source ${SOURCE_DIR}/${header})
  endif()
  if(NOT EXISTS ${source})
    message(FATAL_ERROR "StageHeaders: ${header} (${source}) does not exist")
  endif()
  get_filename_component(folder ${header} DIRECTORY)
  file(READ ${source} text)
  string(REGEX MATCHALL "#include \"[^\"]+\"" includes "${text}")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "#include \"([^\"]+)\"" "\\1" name "${line}")
    if(name MATCHES "^(${layer_alternatives})/" OR name MATCHES "^moeblaze/")
      list(APPEND todo ${name})
    else()
      list(APPEND todo ${folder}/${name})  # a header of the same folder
    endif()
  endforeach()
  string(REGEX REPLACE "#include \"((${layer_alternatives})/[^\"]+)\"" "#include \"moeblaze/\\1\"" text "${text}")
  if(header MATCHES "^moeblaze/")
    file(WRITE ${OUT_DIR}/${header} "${text}")
  else()
    file(WRITE ${OUT_DIR}/moeblaze/${header} "${text}")
  endif()
endwhile()
list(SORT done)
string(REPLACE ";" "\n" listing "${done}")
file(WRITE ${STAMP} "${listing}\n")
