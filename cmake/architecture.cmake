# docs/architecture.md's layer picture, drawn from the build's own target links (issue 18).
#
# gp_write_architecture(<names>) runs at configure time, after every library is defined: for each
# library it reads the LINK_LIBRARIES property that target_link_libraries filled (PUBLIC and PRIVATE
# alike), keeps our own libraries (gp_*, not gp_warnings), gives each a level one above its highest
# dependency, and writes
#   ${PROJECT_BINARY_DIR}/architecture_layers.md  the block docs/architecture.md must contain
#   ${PROJECT_BINARY_DIR}/architecture.dot        the same graph for Graphviz (dot -Tpng)
# The test architecture_doc_test (cmake/architecture_check.cmake) fails when the block in
# docs/architecture.md differs; `ninja architecture-doc` rewrites it.

# The library's target name: "cli" is the graphpipe executable, the rest are gp_<name>.
function(gp_arch_target lib out)
  if(lib STREQUAL "cli")
    set(${out} graphpipe PARENT_SCOPE)
  else()
    set(${out} gp_${lib} PARENT_SCOPE)
  endif()
endfunction()

# The names (from `names`) of the libraries `lib` links directly, sorted.
function(gp_arch_deps lib names out)
  gp_arch_target(${lib} tgt)
  get_target_property(links ${tgt} LINK_LIBRARIES)
  set(deps "")
  foreach(other ${names})
    gp_arch_target(${other} otgt)
    if(NOT other STREQUAL lib AND otgt IN_LIST links)
      list(APPEND deps ${other})
    endif()
  endforeach()
  list(SORT deps)
  set(${out} "${deps}" PARENT_SCOPE)
endfunction()

# Level of each library (0: links none of ours); sets GP_ARCH_LEVEL_<lib> and GP_ARCH_DEPS_<lib> in
# the caller. A cycle would never settle: it is a configure error.
macro(gp_arch_levels names)
  foreach(lib ${names})
    gp_arch_deps(${lib} "${names}" GP_ARCH_DEPS_${lib})
    set(GP_ARCH_LEVEL_${lib} 0)
  endforeach()
  list(LENGTH names _gp_n)
  foreach(_gp_round RANGE ${_gp_n})
    set(_gp_changed OFF)
    foreach(lib ${names})
      foreach(dep ${GP_ARCH_DEPS_${lib}})
        math(EXPR _gp_above "${GP_ARCH_LEVEL_${dep}} + 1")
        if(_gp_above GREATER GP_ARCH_LEVEL_${lib})
          set(GP_ARCH_LEVEL_${lib} ${_gp_above})
          set(_gp_changed ON)
        endif()
      endforeach()
    endforeach()
    if(NOT _gp_changed)
      break()
    endif()
  endforeach()
  if(_gp_changed)
    message(FATAL_ERROR "architecture: the library links form a cycle")
  endif()
endmacro()

function(gp_write_architecture names)
  gp_arch_levels("${names}")
  set(top 0)
  foreach(lib ${names})
    if(GP_ARCH_LEVEL_${lib} GREATER top)
      set(top ${GP_ARCH_LEVEL_${lib}})
    endif()
  endforeach()
  list(LENGTH names count)
  math(EXPR nlevels "${top} + 1")
  set(md "<!-- generated from the build's target links by cmake/architecture.cmake; `ninja architecture-doc` rewrites it -->\n")
  string(APPEND md "${count} libraries on ${nlevels} levels. Each line: a library and the libraries it links directly\n")
  string(APPEND md "(target_link_libraries, PUBLIC or PRIVATE); every link points to a lower level.\n\n```\n")
  set(dot "digraph graphpipe {\n  rankdir=BT;\n  node [shape=box];\n")
  foreach(level RANGE ${top} 0 -1)
    foreach(lib ${names})
      if(GP_ARCH_LEVEL_${lib} EQUAL level)
        gp_arch_target(${lib} tgt)
        string(REPLACE ";" " " deps "${GP_ARCH_DEPS_${lib}}")
        set(line "level ${level}  ${lib}")
        string(LENGTH "${line}" len)
        math(EXPR pad "20 - ${len}")
        string(REPEAT " " ${pad} spaces)
        if(deps STREQUAL "")
          string(APPEND md "${line}\n")
        else()
          string(APPEND md "${line}${spaces}-> ${deps}\n")
        endif()
        foreach(dep ${GP_ARCH_DEPS_${lib}})
          string(APPEND dot "  \"${lib}\" -> \"${dep}\";\n")
        endforeach()
      endif()
    endforeach()
  endforeach()
  string(APPEND md "```\n<!-- end of generated picture -->\n")
  string(APPEND dot "}\n")
  file(WRITE ${PROJECT_BINARY_DIR}/architecture_layers.md "${md}")
  file(WRITE ${PROJECT_BINARY_DIR}/architecture.dot "${dot}")
endfunction()

# Draw the picture when every library of the full build is there (a partial or torch-free build
# cannot draw it), and register the test and the target that keep docs/architecture.md in step.
function(gp_architecture_doc names)
  foreach(lib ${names})
    gp_arch_target(${lib} tgt)
    if(NOT TARGET ${tgt})
      return()
    endif()
  endforeach()
  gp_write_architecture("${names}")
  set(args -DDOC=${PROJECT_SOURCE_DIR}/docs/architecture.md
           -DBLOCK=${PROJECT_BINARY_DIR}/architecture_layers.md)
  add_test(NAME architecture_doc_test
           COMMAND ${CMAKE_COMMAND} ${args} -P ${PROJECT_SOURCE_DIR}/cmake/architecture_check.cmake)
  add_custom_target(architecture-doc
    COMMAND ${CMAKE_COMMAND} ${args} -DUPDATE=ON -P ${PROJECT_SOURCE_DIR}/cmake/architecture_check.cmake
    COMMENT "docs/architecture.md: layer picture from the build's target links")
endfunction()
