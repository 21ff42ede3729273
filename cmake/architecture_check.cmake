# cmake -DDOC=docs/architecture.md -DBLOCK=<build>/architecture_layers.md [-DUPDATE=ON] -P this file
# Compares the generated layer picture (cmake/architecture.cmake) with the one in DOC, between the
# "<!-- generated from the build's target links" line and "<!-- end of generated picture -->";
# fails naming the difference, or with UPDATE=ON rewrites that part of DOC.
set(begin_marker "<!-- generated from the build's target links")
set(end_marker "<!-- end of generated picture -->\n")
file(READ ${DOC} doc)
file(READ ${BLOCK} block)
string(FIND "${doc}" "${begin_marker}" begin)
string(FIND "${doc}" "${end_marker}" end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "${DOC}: no generated layer picture (markers '${begin_marker}' ... "
                      "'<!-- end of generated picture -->'); run `ninja architecture-doc`")
endif()
string(LENGTH "${end_marker}" end_len)
math(EXPR stop "${end} + ${end_len}")
math(EXPR len "${stop} - ${begin}")
string(SUBSTRING "${doc}" ${begin} ${len} current)
if(current STREQUAL block)
  return()
endif()
if(UPDATE)
  string(SUBSTRING "${doc}" 0 ${begin} head)
  string(SUBSTRING "${doc}" ${stop} -1 tail)
  file(WRITE ${DOC} "${head}${block}${tail}")
  message(STATUS "${DOC}: layer picture updated from the build")
  return()
endif()
message(FATAL_ERROR "${DOC} differs from the build's target links.\nIn the doc:\n${current}\n"
                    "From the build (${BLOCK}):\n${block}\nRun `ninja architecture-doc` and review.")
