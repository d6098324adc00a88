# Included by ctest (TEST_INCLUDE_FILES, see CMakeLists.txt) after the tests
# gtest_discover_tests found in cat_unit_tests: each gets the labels cat and unit.
foreach(t IN LISTS cat_unit_tests_TESTS)
  set_tests_properties(${t} PROPERTIES LABELS "cat;unit")
endforeach()
