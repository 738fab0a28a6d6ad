# The CTest `layering`: an upward include is a build error. For every layer it builds two
# probe targets with exactly that layer's include view (its root and its dependencies'):
#   layering_allowed_<L>   includes a header of every layer L depends on: must compile;
#   layering_forbidden_<L> one file per layer that is neither L nor below it, each including
#                          one of that layer's headers: every file must fail with
#                          "<layer>/<header>: No such file or directory".
# The probes are EXCLUDE_FROM_ALL; tests/layering/check_layering.cmake builds them.
get_property(layers GLOBAL PROPERTY MOEBLAZE_LAYERS)

# Layers below `layer` (transitively), from the DEPENDS each layer declared.
function(moeblaze_layers_below layer out)
  set(seen "")
  set(todo ${layer})
  while(todo)
    list(POP_FRONT todo current)
    get_property(deps GLOBAL PROPERTY MOEBLAZE_LAYER_DEPENDS_${current})
    foreach(dep IN LISTS deps)
      foreach(candidate IN LISTS layers)
        get_property(t GLOBAL PROPERTY MOEBLAZE_LAYER_TARGET_${candidate})
        if(dep STREQUAL t AND NOT candidate IN_LIST seen)
          list(APPEND seen ${candidate})
          list(APPEND todo ${candidate})
        endif()
      endforeach()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

set(probe_dir ${CMAKE_BINARY_DIR}/layering)
set(expectations "")
foreach(layer IN LISTS layers)
  get_property(deps GLOBAL PROPERTY MOEBLAZE_LAYER_DEPENDS_${layer})
  moeblaze_layers_below(${layer} below)
  set(allowed_text "// Generated: every layer below ${layer} is visible from it.\n")
  set(forbidden_sources "")
  foreach(other IN LISTS layers)
    if(other STREQUAL layer)
      continue()
    endif()
    file(GLOB headers RELATIVE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/${other}/*.hpp ${CMAKE_SOURCE_DIR}/${other}/*.h)
    list(SORT headers)
    list(GET headers 0 header)
    if(other IN_LIST below)
      string(APPEND allowed_text "#include \"${header}\"\n")
    else()
      set(src ${probe_dir}/${layer}_includes_${other}.cpp)
      file(CONFIGURE OUTPUT ${src} CONTENT "// Generated: ${layer} is not above ${other}, so this must not compile.\n#include \"${header}\"\n")
      list(APPEND forbidden_sources ${src})
      list(APPEND expectations "${layer}|${header}")
    endif()
  endforeach()
  string(APPEND allowed_text "int moeblaze_layering_probe_${layer}() { return 0; }\n")
  file(CONFIGURE OUTPUT ${probe_dir}/${layer}_allowed.cpp CONTENT "${allowed_text}")

  # The layer's own compile view: its root (a link named after the folder) and its PUBLIC
  # dependencies, as moeblaze_layer gives them to the layer's sources.
  foreach(kind allowed forbidden)
    if(kind STREQUAL allowed)
      set(sources ${probe_dir}/${layer}_allowed.cpp)
    else()
      set(sources ${forbidden_sources})
    endif()
    if(NOT sources)
      continue()
    endif()
    add_library(layering_${kind}_${layer} OBJECT EXCLUDE_FROM_ALL ${sources})
    target_include_directories(layering_${kind}_${layer} PRIVATE ${MOEBLAZE_LAYER_ROOTS}/${layer})
    target_link_libraries(layering_${kind}_${layer} PRIVATE ${deps})
  endforeach()
endforeach()

add_test(NAME layering COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
  "-DLAYERS=${layers}" "-DEXPECTATIONS=${expectations}" -P ${CMAKE_SOURCE_DIR}/tests/layering/check_layering.cmake)
set_tests_properties(layering PROPERTIES LABELS cpu)
