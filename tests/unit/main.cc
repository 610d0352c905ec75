// The doctest runner of the unit-test executable; test cases live in the
// other files of this folder.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
