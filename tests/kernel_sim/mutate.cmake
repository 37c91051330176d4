# cmake -DSPEC=<mutation.cmake> -DSRC=<header> -DOUT=<copy> -P mutate.cmake:
# writes SRC with FROM (which must occur exactly once) replaced by TO.
include(${SPEC})
file(READ ${SRC} text)
string(FIND "${text}" "${FROM}" first)
string(FIND "${text}" "${FROM}" last REVERSE)
if(first EQUAL -1)
  message(FATAL_ERROR "kernel mutant: the text to replace is not in ${SRC} any more:\n${FROM}")
endif()
if(NOT first EQUAL last)
  message(FATAL_ERROR "kernel mutant: the text to replace occurs more than once in ${SRC}:\n${FROM}")
endif()
string(REPLACE "${FROM}" "${TO}" text "${text}")
file(WRITE ${OUT} "${text}")
