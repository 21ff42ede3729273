# The one place that lists warning flags (applied to our targets via gp_warnings).
add_library(gp_warnings INTERFACE)
target_compile_options(gp_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow=local
  -Wno-unused-parameter -Wno-missing-field-initializers)
if(GP_WERROR)
  target_compile_options(gp_warnings INTERFACE -Werror)
endif()

# GCC 12 false positives on std::string: once `"x" + std::to_string(i)` (operator+ into insert) is
# inlined down to char_traits::copy, GCC 12's value ranges invent memcpy sizes near PTRDIFF_MAX and
# -Wrestrict reports "accessing 9223372036854775810 or more bytes ... may overlap" in code without a
# bug (GCC bugs 105329 and 105651). Which lines warn depends on inlining (-O2 vs -O3, unrelated
# edits), and the pattern is everywhere in tests, so -Wrestrict is off on GCC 12 only; other
# compilers keep it. (Two lines that drew GCC 12's -Warray-bounds / -Wstringop-overflow /
# -Wstringop-overread on the same memcpy were rewritten instead: runtime/launch/worker.cpp,
# runtime/launch/link_bench.cpp. If such a warning shows up elsewhere, prefer that over another -Wno-.)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(gp_warnings INTERFACE -Wno-restrict)
endif()

# gp_add_test(NAME src... LIBS ...): a GoogleTest executable registered with ctest.
function(gp_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest_main GTest::gmock gp_warnings)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT ${T_TIMEOUT})
endfunction()
