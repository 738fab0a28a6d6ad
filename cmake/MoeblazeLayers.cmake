# moeblaze_layer(<folder> [TARGET <name>] [SHARED | EXECUTABLE] [SUBDIRS <dir>...]
#                [SOURCES <extra>...] [DEPENDS <target>...])
#
# One layer: the .cpp files of <folder> (and of its SUBDIRS) as one target, by default the
# static library moeblaze_<folder>. Its include root is a build-tree folder that holds only
# a link named <folder> to the source folder, so the layer's files and everything above it
# include its headers as "<folder>/<header>". DEPENDS are PUBLIC: a layer sees the roots of
# the layers it depends on, and no others. That is what makes an upward include a build
# error; tests/layering/ proves it.
set(MOEBLAZE_LAYER_ROOTS ${CMAKE_BINARY_DIR}/include_roots)
set_property(GLOBAL PROPERTY MOEBLAZE_LAYERS "")

function(moeblaze_layer folder)
  cmake_parse_arguments(L "SHARED;EXECUTABLE" "TARGET" "SUBDIRS;SOURCES;DEPENDS" ${ARGN})
  set(target moeblaze_${folder})
  if(L_TARGET)
    set(target ${L_TARGET})
  endif()
  set(globs ${CMAKE_SOURCE_DIR}/${folder}/*.cpp)
  foreach(sub IN LISTS L_SUBDIRS)
    list(APPEND globs ${CMAKE_SOURCE_DIR}/${folder}/${sub}/*.cpp)
  endforeach()
  file(GLOB sources CONFIGURE_DEPENDS ${globs})
  list(APPEND sources ${L_SOURCES})

  set(root ${MOEBLAZE_LAYER_ROOTS}/${folder})
  file(MAKE_DIRECTORY ${root})
  if(NOT EXISTS ${root}/${folder})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${folder} ${root}/${folder} SYMBOLIC)
  endif()

  if(L_EXECUTABLE)
    add_executable(${target} ${sources})
    target_include_directories(${target} PRIVATE ${root})
    target_link_libraries(${target} PRIVATE ${L_DEPENDS})
  else()
    if(L_SHARED)
      add_library(${target} SHARED ${sources})
    else()
      add_library(${target} STATIC ${sources})
    endif()
    # Installed, every include of a layer's header is spelled "moeblaze/<folder>/<header>"
    # (cmake/StageHeaders.cmake), so PREFIX/include is the one include folder.
    target_include_directories(${target} PUBLIC
      $<BUILD_INTERFACE:${root}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(${target} PUBLIC ${L_DEPENDS})
    # moeblaze::<folder> in this tree and in the installed package alike.
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${folder})
    add_library(moeblaze::${folder} ALIAS ${target})
  endif()
  # Header-only helpers used inside .cpp files only: no part of the installed interface.
  target_link_libraries(${target} PRIVATE
    $<BUILD_INTERFACE:fmt::fmt-header-only> $<BUILD_INTERFACE:nlohmann_json::nlohmann_json>)
  target_compile_options(${target} PRIVATE -Wall -Wextra $<$<BOOL:${MOEBLAZE_WERROR}>:-Werror>)
  # GCC 12 reports std::string's own appends as overlapping copies (-Wrestrict false positives,
  # GCC bug 105329, fixed in 13).
  target_compile_options(${target} PRIVATE
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_GREATER_EQUAL:$<CXX_COMPILER_VERSION>,12>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>)
  # Remembered for the layering test, which compiles probes with this layer's view.
  set_property(GLOBAL APPEND PROPERTY MOEBLAZE_LAYERS ${folder})
  set_property(GLOBAL PROPERTY MOEBLAZE_LAYER_TARGET_${folder} ${target})
  set_property(GLOBAL PROPERTY MOEBLAZE_LAYER_DEPENDS_${folder} ${L_DEPENDS})
endfunction()
