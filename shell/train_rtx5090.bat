@echo off
REM Runs one trainer with its RTX 5090 preset: shell\train_rtx5090.bat {vocoder^|tts^|vae} [extra args]
setlocal
set "HERE=%~dp0.."
set "TRAINER=%~1"
if "%TRAINER%"=="" goto usage
if /I "%TRAINER%"=="vocoder" goto run
if /I "%TRAINER%"=="tts" goto run
if /I "%TRAINER%"=="vae" goto run
echo error: unknown trainer "%TRAINER%" 1>&2
:usage
echo usage: %~nx0 {vocoder^|tts^|vae} [extra trainer args] 1>&2
exit /b 2
:run
shift
set "ARGS="
:collect
if "%~1"=="" goto launch
set ARGS=%ARGS% %1
shift
goto collect
:launch
call "%HERE%\%TRAINER%\train_rtx5090.bat" %ARGS%
exit /b %ERRORLEVEL%
