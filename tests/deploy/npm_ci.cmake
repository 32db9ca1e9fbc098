# cmake -DSRC=<tests/deploy> -DDEST=<build dir> -DNPM=<npm> -P npm_ci.cmake
#
# Installs tests/deploy's locked npm packages (package-lock.json) into DEST/node_modules with
# `npm ci`, unless the lock file installed there last time is the same. The source tree is left
# alone: k8s_validate.js finds the packages through NODE_PATH.
foreach(var SRC DEST NPM)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "npm_ci.cmake: -D${var}= missing")
  endif()
endforeach()
file(MAKE_DIRECTORY "${DEST}")
foreach(f package.json package-lock.json)
  configure_file("${SRC}/${f}" "${DEST}/${f}" COPYONLY)
endforeach()
file(SHA256 "${SRC}/package-lock.json" lock_hash)
set(stamp "${DEST}/node_modules/.attend-lock-sha256")
set(installed "")
if(EXISTS "${stamp}")
  file(READ "${stamp}" installed)
endif()
if(installed STREQUAL lock_hash)
  message(STATUS "node_modules up to date with package-lock.json")
  return()
endif()
execute_process(COMMAND "${NPM}" ci --no-audit --no-fund --loglevel=error
                WORKING_DIRECTORY "${DEST}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "npm ci failed (${rc}): the packages come from the npm registry")
endif()
file(WRITE "${stamp}" "${lock_hash}")
