# The one place that lists warning flags (applied to our targets via gp_warnings).
add_library(gp_warnings INTERFACE)
target_compile_options(gp_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow=local
  -Wno-unused-parameter -Wno-missing-field-initializers)

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
